// Helpers of the devmem path tests over the socket-pair double (devmem_path_test.cc,
// devmem_zcrx_path_test.cc): a loopback TCP pair, the settings, descriptors, an event recorder.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <vector>

#include "core/config.h"
#include "core/sys.h"
#include "transport/path.h"

namespace dmx::devmem_path_test {

inline constexpr auto kPathWait = std::chrono::seconds(60);

// A connected TCP pair on loopback (what the engine's data connection is).
inline std::pair<UniqueFd, UniqueFd> tcp_pair() {
  UniqueFd l(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(l.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(::listen(l.get(), 1), 0);
  socklen_t len = sizeof a;
  EXPECT_EQ(::getsockname(l.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  UniqueFd c(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_EQ(::connect(c.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  UniqueFd s(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
  int one = 1;
  ::setsockopt(c.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(s.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return {std::move(c), std::move(s)};
}

inline Config config(const std::map<std::string, std::string>& extra = {}) {
  Options o;
  o.set("devmem_rx_pool", "32M");
  for (const auto& [k, v] : extra) o.set(k, v);
  auto c = Config::resolve(o);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return std::move(*c);
}

inline std::vector<unsigned char> desc(uint64_t len) {
  std::vector<unsigned char> d(8);
  for (int i = 0; i < 8; ++i) d[i] = static_cast<unsigned char>(len >> (8 * i));
  return d;
}

// Records every event; waits with a deadline.
class Recorder final : public PayloadPath::Events {
 public:
  void on_path_tx_done(uint64_t seq, const Status& s) override { add(&tx_, seq, s); }
  void on_path_rx_done(uint64_t seq, const Status& s) override { add(&rx_, seq, s); }
  void on_path_failed(const Status& s) override {
    std::lock_guard<std::mutex> lock(mu_);
    failed_.push_back(s);
    cv_.notify_all();
  }
  void on_path_stopped() override {
    std::lock_guard<std::mutex> lock(mu_);
    ++stopped_;
    cv_.notify_all();
  }

  Status tx(uint64_t seq) { return get(&tx_, seq); }
  Status rx(uint64_t seq) { return get(&rx_, seq); }
  bool wait_failed() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kPathWait, [&] { return !failed_.empty(); });
  }
  bool wait_stopped() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kPathWait, [&] { return stopped_ > 0; });
  }
  std::vector<Status> failed() {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }
  int stopped() {
    std::lock_guard<std::mutex> lock(mu_);
    return stopped_;
  }
  size_t completions() {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (auto& [k, v] : tx_) n += v.size();
    for (auto& [k, v] : rx_) n += v.size();
    return n;
  }
  bool exactly_once() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto* m : {&tx_, &rx_})
      for (auto& [k, v] : *m)
        if (v.size() != 1) return false;
    return true;
  }

 private:
  using Map = std::map<uint64_t, std::vector<Status>>;
  void add(Map* m, uint64_t seq, const Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    (*m)[seq].push_back(s);
    cv_.notify_all();
  }
  Status get(Map* m, uint64_t seq) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, kPathWait, [&] { return m->contains(seq); }))
      return Status(Code::kTimeout, "test: no completion for seq " + std::to_string(seq));
    return m->at(seq).front();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  Map tx_, rx_;
  std::vector<Status> failed_;
  int stopped_ = 0;
};

}  // namespace dmx::devmem_path_test
