// A trickling authenticated peer (slowloris): it sends a frame one byte at a time, never silent
// for peer_timeout, and must still be dropped once the frame overruns its budget (peer_timeout plus
// the payload at the minimum rate) — while other clients are served.
#include <gtest/gtest.h>

#include <thread>

#include "hostile/hostile_util.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;

TEST(Slowloris, TricklingHeaderIsDroppedWithinTheFrameBudget) {
  Options o = test_options();
  o.set("peer_timeout", "1s").set("keepalive_interval", "200ms");
  Server s = make_server(o);
  auto peer = RawPeer::connect(s.listener.address(), kHostileKey);
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  auto ep = s.listener.accept(10s);
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  Buffer dst = poisoned(MemSpec{}, 4096);
  Request pending = ep->recv(dst.region(), 1);

  // One byte of a 56-byte header every 200 ms: 11 s for the header, never 1 s of silence.
  wire::HeaderBytes bytes = wire::encode_header(frame(wire::FrameType::kEager, 1, 1));
  std::atomic<bool> done{false};
  auto t0 = Clock::now();
  std::thread trickle([&] {
    for (size_t i = 0; i < bytes.size() && !done.load(); ++i) {
      if (!peer->send_bytes(&bytes[i], 1).ok()) return;  // the server closed us
      std::this_thread::sleep_for(200ms);
    }
  });
  expect_serves_a_good_client(s);  // meanwhile

  Status st = pending.wait(6s);
  auto took_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  done = true;
  trickle.join();
  EXPECT_NE(st.code(), Code::kTimeout) << "the trickler still holds the endpoint after " << took_ms << " ms";
  Status health = ep->health();
  ASSERT_FALSE(health.ok());
  EXPECT_EQ(health.code(), Code::kPeerFailed) << health.to_string();
  EXPECT_FALSE(health.peer().empty()) << "the error must name the peer: " << health.to_string();
  EXPECT_NE(health.to_string().find("of a frame"), std::string::npos) << health.to_string();
  // Budget 1 s (peer_timeout; no payload yet) plus the tick that notices it.
  EXPECT_LT(took_ms, 2500) << health.to_string();
  std::printf("trickler dropped after %lld ms: %s\n", static_cast<long long>(took_ms), health.to_string().c_str());
}

}  // namespace
}  // namespace dmx::test
