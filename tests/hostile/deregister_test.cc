// Deregistration against a peer that keeps using the memory: the registration stays valid until
// every operation on it has ended, deregister ends them (the peer is told) and returns in bounded
// time, and no byte lands in the memory afterwards — so the application may free it.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "hostile/hostile_util.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;
using wire::FrameType;

// The next frame from the server that is not a keepalive.
Result<Frame> next_reply(RawPeer& peer) {
  for (;;) {
    DMX_ASSIGN_OR_RETURN(Frame f, recv_frame(peer.fd(), Deadline::after(5s), "server"));
    if (f.header.type != FrameType::kKeepalive) return f;
  }
}

void expect_untouched(const Buffer& b, size_t from, size_t to) {
  auto got = read_back(b.region());
  for (size_t i = from; i < to; ++i) ASSERT_EQ(got[i], 0xA5) << "byte " << i << " was written";
}

TEST(Deregister, WriteThatCanNeverFitIsRefusedWhenItStarts) {
  Server s = make_server();
  Buffer target = poisoned(MemSpec{}, 4096);
  auto reg = s.ctx.register_memory(target.region());
  ASSERT_TRUE(reg.ok());
  auto peer = RawPeer::connect(s.listener.address(), kHostileKey);
  ASSERT_TRUE(peer.ok());
  auto ep = s.listener.accept(10s);
  ASSERT_TRUE(ep.ok());
  // A write of 2^64-1 bytes: it would hold the registration for ever, one chunk at a time.
  auto h = frame(FrameType::kWriteData, 1, reg->remote().key, 0, UINT64_MAX);
  h.payload_len = 100;
  ASSERT_TRUE(peer->send(h, std::vector<unsigned char>(100, 7)).ok());
  Status health = wait_for_failure(*ep, 5s);
  EXPECT_EQ(health.code(), Code::kProtocol) << health.to_string();
  EXPECT_NE(health.message().find("cannot fit"), std::string::npos) << health.to_string();
  auto t0 = Clock::now();
  EXPECT_TRUE(reg->deregister().ok());
  EXPECT_LT(Clock::now() - t0, 5s) << "the refused write must not hold the registration (60 s before)";
  expect_untouched(target, 0, 4096);
  expect_serves_a_good_client(s);
}

TEST(Deregister, EndsAPeersWriteInProgressAndNothingLandsAfter) {
  Server s = make_server();
  Buffer target = poisoned(MemSpec{}, 4096);
  auto reg = s.ctx.register_memory(target.region());
  ASSERT_TRUE(reg.ok());
  const uint64_t key = reg->remote().key;
  auto peer = RawPeer::connect(s.listener.address(), kHostileKey);
  ASSERT_TRUE(peer.ok());
  auto ep = s.listener.accept(10s);
  ASSERT_TRUE(ep.ok());
  auto first = frame(FrameType::kWriteData, 1, key, 0, 4096);
  first.payload_len = 1000;
  ASSERT_TRUE(peer->send(first, std::vector<unsigned char>(1000, 7)).ok());
  // Give the first chunk time to arrive; it is read back only after deregister() returned (reading
  // the region while the server may write it would race).
  std::this_thread::sleep_for(300ms);
  auto t0 = Clock::now();
  Status dereg = reg->deregister();
  auto took = Clock::now() - t0;
  EXPECT_TRUE(dereg.ok()) << dereg.to_string();
  EXPECT_LT(took, 5s) << "deregister waited for a peer that may never finish";
  auto landed = read_back(target.region());
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(landed[i], 7) << "the first chunk did not land whole, byte " << i;
  // The peer is told why its write ended.
  auto ack = next_reply(*peer);
  ASSERT_TRUE(ack.ok()) << ack.status().to_string();
  EXPECT_EQ(ack->header.type, FrameType::kAck);
  EXPECT_EQ(ack->header.id, 1u);
  EXPECT_EQ(static_cast<Code>(ack->header.a0), Code::kNotFound);
  std::string text(ack->payload.begin(), ack->payload.end());
  EXPECT_NE(text.find("deregistered"), std::string::npos) << text;
  // The rest of the write still comes (the peer had sent it already): it must not land.
  auto second = frame(FrameType::kWriteData, 1, key, 1000, 4096);
  second.payload_len = 3096;
  ASSERT_TRUE(peer->send(second, std::vector<unsigned char>(3096, 8)).ok());
  std::this_thread::sleep_for(200ms);
  expect_untouched(target, 1000, 4096);
  EXPECT_TRUE(ep->health().ok()) << "withdrawing a key is not the peer's fault: " << ep->health().to_string();
}

TEST(Deregister, ClosesAPeerThatDoesNotReadWhatItAskedFor) {
  Options o = test_options();
  o.set("deregister_timeout", "500ms");
  Server s = make_server(o);
  Buffer source = poisoned(MemSpec{}, 64 << 20);
  auto reg = s.ctx.register_memory(source.region());
  ASSERT_TRUE(reg.ok());
  auto peer = RawPeer::connect(s.listener.address(), kHostileKey);
  ASSERT_TRUE(peer.ok());
  auto ep = s.listener.accept(10s);
  ASSERT_TRUE(ep.ok());
  // READ_REQ for 64 MiB, then the peer reads nothing: the answer sits on a full socket.
  ASSERT_TRUE(peer->send(frame(FrameType::kReadReq, 1, reg->remote().key, 0, 64 << 20)).ok());
  std::this_thread::sleep_for(300ms);
  auto t0 = Clock::now();
  Status dereg = reg->deregister();
  auto took = Clock::now() - t0;
  EXPECT_TRUE(dereg.ok()) << dereg.to_string();
  EXPECT_LT(took, 8s) << "500 ms deregister_timeout, then the peer is closed";
  Status health = ep->health();
  EXPECT_EQ(health.code(), Code::kResourceExhausted) << health.to_string();
  EXPECT_NE(health.message().find("deregistered"), std::string::npos) << health.to_string();
  expect_serves_a_good_client(s);
}

TEST(Deregister, RealPeersWriteAndReadFailOnBothSides) {
  Pair p = connect_pair();
  Buffer target = poisoned(MemSpec{}, 256 << 20);
  auto reg = p.ctx.register_memory(target.region());
  ASSERT_TRUE(reg.ok());
  Filled src = filled(MemSpec{}, 256 << 20);
  std::vector<Request> ops;
  for (int i = 0; i < 8; ++i) ops.push_back(p.client.write(src.buf.region(), reg->remote(), 0));
  Buffer back = poisoned(MemSpec{}, 256 << 20);
  for (int i = 0; i < 8; ++i) ops.push_back(p.client.read(back.region(), reg->remote(), 0));
  std::this_thread::sleep_for(20ms);
  auto t0 = Clock::now();
  EXPECT_TRUE(reg->deregister().ok());
  EXPECT_LT(Clock::now() - t0, 5s);
  int refused = 0;
  for (auto& r : ops) {
    Status st = r.wait(20s);
    ASSERT_NE(st.code(), Code::kTimeout);
    if (!st.ok()) {
      EXPECT_EQ(st.code(), Code::kNotFound) << st.to_string();
      ++refused;
    }
  }
  EXPECT_GT(refused, 0) << "16 x 256 MiB cannot all have finished within 20 ms";
  // Memory the application may now free: nothing arrives any more.
  auto snapshot = read_back(target.region());
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(read_back(target.region()) == snapshot) << "bytes landed after deregister returned";
  EXPECT_TRUE(p.client.health().ok()) << p.client.health().to_string();
  EXPECT_TRUE(p.server.health().ok()) << p.server.health().to_string();
}

}  // namespace
}  // namespace dmx::test
