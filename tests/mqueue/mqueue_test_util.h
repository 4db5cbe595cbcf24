// Helpers for the Lynx tests: a server on loopback, events captured, raw sockets.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mqueue/host_centric.h"
#include "mqueue/kv_service.h"
#include "mqueue/load.h"
#include "mqueue/net.h"
#include "mqueue/server.h"

namespace dmx::mqueue::testing {

// Collects the dispatcher's event lines (thread-safe).
class Events {
 public:
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& s) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back(s);
    };
  }
  bool any_contains(const std::string& a, const std::string& b = "") const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& l : lines_)
      if (l.find(a) != std::string::npos && l.find(b) != std::string::npos) return true;
    return false;
  }
  std::string all() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string s;
    for (const auto& l : lines_) s += l + "\n";
    return s;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

inline ServerConfig host_config(Events& ev, uint32_t workers = 2, uint32_t slots = 16, uint32_t max = 4096) {
  ServerConfig c;
  c.geometry.workers = workers;
  c.geometry.slots = slots;
  c.geometry.max_request = max;
  c.geometry.max_response = max;
  c.memory = MemSpec{MemKind::kHost, 0};
  c.dispatch.udp = "127.0.0.1:0";
  c.dispatch.tcp = "127.0.0.1:0";
  c.dispatch.on_event = ev.sink();
  return c;
}

// Polls cond() up to `timeout` (tests never sleep a fixed time to wait for something).
template <typename Cond>
bool eventually(Cond cond, std::chrono::milliseconds timeout = std::chrono::seconds(120)) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return cond();
}

inline std::vector<uint8_t> frame(uint32_t magic, uint32_t len, uint64_t tag, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> f(sizeof(WireHeader) + payload.size());
  WireHeader h{magic, len, tag};
  std::memcpy(f.data(), &h, sizeof h);
  if (!payload.empty()) std::memcpy(f.data() + sizeof h, payload.data(), payload.size());
  return f;
}

inline std::string local_name(int fd) {
  auto a = local_address(fd);
  return a.ok() ? a->to_string() : "?";
}

}  // namespace dmx::mqueue::testing
