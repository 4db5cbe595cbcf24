// Helpers of the hostile-peer suite: a server to attack, a check that it still serves a good
// client, frames to craft, and what the attack cost (resident memory, log lines).
#pragma once

#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>

#include <atomic>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/log.h"
#include "engine/raw_peer.h"
#include "engine/test_util.h"

namespace dmx::test {

inline constexpr const char* kHostileKey = "dmx-test-key-0123456789";

// Sanitizer builds keep freed memory in quarantine and shadow it: resident memory says little there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

struct Server {
  Context ctx;
  Listener listener;
};

inline Server make_server(Options o = test_options()) {
  Server s;
  auto ctx = Context::create(o);
  EXPECT_TRUE(ctx.ok()) << ctx.status().to_string();
  s.ctx = *ctx;
  s.listener = std::move(*s.ctx.listen("tcp://127.0.0.1:0"));
  return s;
}

// A good client connects and moves data while (or after) the server is attacked.
inline void expect_serves_a_good_client(Server& s) {
  using namespace std::chrono_literals;
  auto c = s.ctx.connect(s.listener.address());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto e = s.listener.accept(10s);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  Filled src = filled(MemSpec{}, 100000);
  Buffer dst = poisoned(MemSpec{}, 100000);
  Request r = e->recv(dst.region(), 1);
  ASSERT_TRUE(c->send(src.buf.region(), 1).wait(10s).ok());
  ASSERT_TRUE(r.wait(10s).ok());
  ASSERT_EQ(read_back(dst.region()), src.data);
}

inline wire::FrameHeader frame(wire::FrameType t, uint64_t id = 0, uint64_t a0 = 0, uint64_t a1 = 0,
                               uint64_t a2 = 0, uint64_t a3 = 0) {
  wire::FrameHeader h;
  h.type = t;
  h.id = id;
  h.a0 = a0;
  h.a1 = a1;
  h.a2 = a2;
  h.a3 = a3;
  return h;
}

// The endpoint's error once it has failed, polling up to `bound` (ok if it is still healthy then).
inline Status wait_for_failure(const Endpoint& ep, std::chrono::milliseconds bound) {
  Status health;
  for (auto until = Clock::now() + bound; Clock::now() < until && (health = ep.health()).ok();)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return health;
}

// Connects a raw peer, accepts its endpoint, posts a recv, sends `frames`, and returns the
// server endpoint's error (waiting up to 5 s for it).
inline Status provoke(Server& s,
                      const std::vector<std::pair<wire::FrameHeader, std::vector<unsigned char>>>& frames) {
  using namespace std::chrono_literals;
  auto peer = RawPeer::connect(s.listener.address(), kHostileKey);
  EXPECT_TRUE(peer.ok()) << peer.status().to_string();
  auto ep = s.listener.accept(10s);
  EXPECT_TRUE(ep.ok());
  Buffer dst = poisoned(MemSpec{}, 4096);
  Request pending = ep->recv(dst.region(), 999);  // must fail, not hang, once the peer misbehaves
  for (const auto& [h, payload] : frames) (void)peer->send(h, payload);
  Status st = pending.wait(5s);
  EXPECT_NE(st.code(), Code::kTimeout) << "a pending recv hung after the peer misbehaved";
  Status health = ep->health();
  EXPECT_FALSE(health.ok());
  EXPECT_FALSE(health.peer().empty()) << "the error must name the peer: " << health.to_string();
  return health;
}

// This process's resident memory in KiB (VmRSS).
inline uint64_t rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string key;
  uint64_t value = 0;
  while (in >> key) {
    if (key == "VmRSS:") {
      in >> value;
      return value;
    }
    in.ignore(1 << 16, '\n');
  }
  return 0;
}

// Counts the lines dmx logs (every level) while it lives. Create it before any dmx thread starts:
// spdlog's sink list is not safe to change while another thread logs.
class LogCounter {
 public:
  LogCounter() : sink_(std::make_shared<Sink>()) { logger().sinks().push_back(sink_); }
  ~LogCounter() { std::erase(logger().sinks(), sink_); }
  uint64_t lines() const { return sink_->count.load(); }

 private:
  struct Sink : spdlog::sinks::base_sink<std::mutex> {
    std::atomic<uint64_t> count{0};
    void sink_it_(const spdlog::details::log_msg&) override { ++count; }
    void flush_() override {}
  };
  std::shared_ptr<Sink> sink_;
};

}  // namespace dmx::test
