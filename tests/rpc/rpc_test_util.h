// Helpers for the SplitRPC tests: a server on host memory and its contexts.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "dmx/dmx.h"
#include "rpc/client.h"
#include "rpc/server.h"
#include "rpc/service.h"
#include "test_env.h"

namespace dmx::rpc::test {

inline Options options() {
  Options o;
  o.set("auth_key", "dmx-test-key-0123456789").set("streams", "1").set("log_level", "error");
  return o;
}

inline std::vector<unsigned char> random_bytes(size_t n) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

inline std::vector<unsigned char> expected(Method m, const std::vector<unsigned char>& in) {
  std::vector<unsigned char> out(response_size(m, static_cast<uint32_t>(in.size())).value());
  run_host(m, in.data(), in.size(), out.data());
  return out;
}

struct Rig {
  Context server_ctx, client_ctx;
  std::unique_ptr<Server> server;
};

inline Rig start(Mode mode, uint32_t clients = 4, uint32_t slots = 4, uint32_t slot_size = 64 << 10,
                 Duration request_timeout = std::chrono::seconds(10), MemSpec mem = MemSpec{MemKind::kHost, 0}) {
  Rig r;
  r.server_ctx = Context::create(options()).value();
  r.client_ctx = Context::create(options()).value();
  ServerConfig c;
  c.pool = PoolShape{mem, clients, slots, slot_size};
  c.orchestration.mode = mode;
  c.orchestration.max_batch = 4;
  c.request_timeout = request_timeout;
  c.quiet = true;
  auto s = Server::start(r.server_ctx, "tcp://127.0.0.1:0", c);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  if (s.ok()) r.server = std::move(*s);
  return r;
}

// Polls `cond` until it holds or kEventually passes (a deadline, not a timing assertion).
inline bool eventually(const std::function<bool()>& cond) {
  auto end = std::chrono::steady_clock::now() + ::dmx::test::kEventually;
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

}  // namespace dmx::rpc::test
