// Vectored operations from a hostile peer: a vectored write's chunk outside its region, a vectored
// read's segment outside its region, a read that announces segments without end. Each closes that
// peer's endpoint with an error naming it and the reason; no byte lands outside; others go on.
#include <gtest/gtest.h>

#include "hostile/hostile_util.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;
using wire::FrameHeader;
using wire::FrameType;

// A good client still connects and writes a list: the others go on.
void expect_others_go_on(Server& s) {
  auto c = s.ctx.connect(s.listener.address());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto e = s.listener.accept(10s);
  ASSERT_TRUE(e.ok());
  Buffer target = poisoned(MemSpec{}, 4096);
  auto reg = s.ctx.register_memory(target.region());
  ASSERT_TRUE(reg.ok());
  Filled src = filled(MemSpec{}, 4096);
  MemRegion local[] = {src.buf.region()};
  RemoteRegion remote[] = {reg->remote()};
  IoEntry entries[] = {{0, 0, 0, 100, 50}, {0, 0, 2000, 10, 30}};
  OpOptions notify;
  notify.notify = true;
  ASSERT_TRUE(c->write_vec(local, remote, entries, notify).wait(10s).ok());
  // Read back once the target side has the notification (the data has landed): the initiator's
  // completion came through shared memory that this process maps twice, a hand-over
  // ThreadSanitizer does not see.
  auto note = e->next_notification(10s);
  ASSERT_TRUE(note.ok()) << note.status().to_string();
  auto got = read_back(target.region());
  EXPECT_TRUE(std::equal(src.data.begin(), src.data.begin() + 50, got.begin() + 100));
  EXPECT_TRUE(std::equal(src.data.begin() + 2000, src.data.begin() + 2030, got.begin() + 10));
}

FrameHeader vec_write(uint64_t id, uint64_t key, uint64_t offset, uint64_t total, uint32_t len) {
  FrameHeader h;
  h.type = FrameType::kWriteData;
  h.flags = wire::kFlagVector;
  h.id = id;
  h.a0 = key;
  h.a1 = offset;
  h.a2 = total;
  h.payload_len = len;
  return h;
}

TEST(BadPeerVec, WriteChunkOutsideItsRegion) {
  Server s = make_server();
  Buffer a = poisoned(MemSpec{}, 1000), b = poisoned(MemSpec{}, 1000);
  auto ra = s.ctx.register_memory(a.region());
  auto rb = s.ctx.register_memory(b.region());
  ASSERT_TRUE(ra.ok() && rb.ok());
  // The first chunk is fine; the second names the other region past its end (and near 2^64).
  Status st = provoke(s, {{vec_write(1, ra->remote().key, 0, 40, 20), std::vector<unsigned char>(20, 5)},
                          {vec_write(1, rb->remote().key, UINT64_MAX - 5, 40, 20), std::vector<unsigned char>(20, 6)}});
  EXPECT_EQ(st.code(), Code::kProtocol) << st.to_string();
  EXPECT_NE(st.message().find("outside"), std::string::npos) << st.to_string();
  for (unsigned char c : read_back(b.region())) ASSERT_EQ(c, 0xA5) << "an out-of-bounds chunk touched a region";
  expect_others_go_on(s);
}

TEST(BadPeerVec, WriteChunksBeyondTheAnnouncedLength) {
  Server s = make_server();
  Buffer a = poisoned(MemSpec{}, 1000);
  auto ra = s.ctx.register_memory(a.region());
  ASSERT_TRUE(ra.ok());
  Status st = provoke(s, {{vec_write(1, ra->remote().key, 0, 30, 20), std::vector<unsigned char>(20, 5)},
                          {vec_write(1, ra->remote().key, 500, 30, 20), std::vector<unsigned char>(20, 6)}});
  EXPECT_NE(st.message().find("more than"), std::string::npos) << st.to_string();
  auto got = read_back(a.region());
  for (size_t i = 500; i < 520; ++i) ASSERT_EQ(got[i], 0xA5);
}

FrameHeader vec_read(uint64_t id, uint64_t key, uint64_t offset, uint64_t len, bool more) {
  FrameHeader h;
  h.type = FrameType::kReadReq;
  h.flags = static_cast<uint8_t>(wire::kFlagVector | (more ? wire::kFlagMore : 0));
  h.id = id;
  h.a0 = key;
  h.a1 = offset;
  h.a2 = len;
  return h;
}

TEST(BadPeerVec, ReadSegmentOutsideItsRegion) {
  Server s = make_server();
  Buffer a = filled(MemSpec{}, 1000).buf;
  auto ra = s.ctx.register_memory(a.region());
  ASSERT_TRUE(ra.ok());
  Status st = provoke(s, {{vec_read(1, ra->remote().key, 0, 100, true), {}},
                          {vec_read(1, ra->remote().key, 950, 100, false), {}}});
  EXPECT_EQ(st.code(), Code::kProtocol) << st.to_string();
  EXPECT_NE(st.message().find("outside"), std::string::npos) << st.to_string();
  expect_others_go_on(s);
}

// A read whose segments never end is held in the peer_memory_budget: the peer is closed once its
// announced segments exceed it, instead of growing without bound.
TEST(BadPeerVec, EndlessReadSegmentsHitTheMemoryBudget) {
  Options o = test_options();
  o.set("peer_memory_budget", "1M");
  Server s = make_server(o);
  Buffer a = filled(MemSpec{}, 1 << 20).buf;
  auto ra = s.ctx.register_memory(a.region());
  ASSERT_TRUE(ra.ok());
  std::vector<std::pair<FrameHeader, std::vector<unsigned char>>> frames;
  for (uint64_t i = 0; i < 40000; ++i) frames.push_back({vec_read(1, ra->remote().key, (i * 16) % 4096, 8, true), {}});
  Status st = provoke(s, frames);
  EXPECT_EQ(st.code(), Code::kResourceExhausted) << st.to_string();
  EXPECT_NE(st.message().find("vectored read"), std::string::npos) << st.to_string();
  expect_others_go_on(s);
}

}  // namespace
}  // namespace dmx::test
