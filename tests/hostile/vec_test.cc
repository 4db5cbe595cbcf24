// Vectored operations from a hostile peer: a vectored write's chunk outside its region, a vectored
// read's segment outside its region (one READ_REQ per segment, or in a READ_REQ table), a read that
// announces segments without end. Each closes that peer's endpoint with an error naming it and the
// reason; no byte lands outside; others go on. And a good read that mixes both forms is served.
#include <gtest/gtest.h>

#include <sys/socket.h>

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

// A READ_REQ table of `segs` (key, offset, length each).
std::pair<FrameHeader, std::vector<unsigned char>> read_table(uint64_t id, const std::vector<wire::TableEntry>& segs,
                                                              bool more) {
  FrameHeader h;
  h.type = FrameType::kReadReq;
  h.flags = static_cast<uint8_t>(wire::kFlagVector | wire::kFlagTable | (more ? wire::kFlagMore : 0));
  h.id = id;
  h.a0 = segs.size();
  std::vector<unsigned char> table(segs.size() * wire::kTableEntrySize);
  for (size_t k = 0; k < segs.size(); ++k) wire::put_table_entry(table.data() + k * wire::kTableEntrySize, segs[k]);
  h.payload_len = static_cast<uint32_t>(table.size());
  return {h, table};
}

TEST(BadPeerVec, ReadTableSegmentOutsideItsRegion) {
  Server s = make_server();
  Buffer a = filled(MemSpec{}, 1000).buf;
  auto ra = s.ctx.register_memory(a.region());
  ASSERT_TRUE(ra.ok());
  uint64_t key = ra->remote().key;
  Status st = provoke(s, {read_table(1, {{key, 0, 100}, {key, 200, 50}}, true),
                          read_table(1, {{key, 300, 10}, {key, 999, 2}}, false)});
  EXPECT_EQ(st.code(), Code::kProtocol) << st.to_string();
  EXPECT_NE(st.message().find("outside"), std::string::npos) << st.to_string();
  expect_others_go_on(s);
}

// A READ_REQ table whose header and payload disagree is refused by the frame decoder.
TEST(BadPeerVec, ReadTableOfAnotherSize) {
  Server s = make_server();
  auto f = read_table(1, {{5, 0, 100}, {5, 200, 50}}, false);
  f.second.pop_back();
  f.first.payload_len = static_cast<uint32_t>(f.second.size());
  Status st = provoke(s, {f});
  EXPECT_EQ(st.code(), Code::kProtocol) << st.to_string();
  EXPECT_NE(st.message().find("READ_REQ table of 2 segments carries 39 bytes"), std::string::npos) << st.to_string();
  expect_others_go_on(s);
}

// Segments in a READ_REQ table, then one in a READ_REQ of its own (as a segment of 4 GiB or more
// goes), then a table again: served as one read, in order, byte-exact.
TEST(BadPeerVec, AReadMixingTablesAndPlainSegmentsIsServed) {
  Server s = make_server();
  Filled a = filled(MemSpec{}, 5000);
  auto ra = s.ctx.register_memory(a.buf.region());
  ASSERT_TRUE(ra.ok());
  uint64_t key = ra->remote().key;
  auto peer = RawPeer::connect(s.listener.address(), kHostileKey);
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  auto ep = s.listener.accept(10s);
  ASSERT_TRUE(ep.ok());
  auto first = read_table(7, {{key, 10, 100}, {key, 4000, 7}}, true);
  ASSERT_TRUE(peer->send(first.first, first.second).ok());
  ASSERT_TRUE(peer->send(vec_read(7, key, 2000, 1000, true)).ok());
  auto last = read_table(7, {{key, 0, 1}}, false);
  ASSERT_TRUE(peer->send(last.first, last.second).ok());
  std::vector<unsigned char> want;
  for (auto [at, n] : {std::pair<size_t, size_t>{10, 100}, {4000, 7}, {2000, 1000}, {0, 1}})
    want.insert(want.end(), a.data.begin() + static_cast<ptrdiff_t>(at), a.data.begin() + static_cast<ptrdiff_t>(at + n));
  std::vector<unsigned char> got(want.size(), 0);
  size_t landed = 0, tables = 0;
  while (landed < want.size()) {
    auto f = peer->read(0);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    if (f->header.type != FrameType::kReadData) continue;
    ASSERT_EQ(f->header.id, 7u);
    ASSERT_EQ(f->header.a1, want.size());
    if (f->header.flags & wire::kFlagTable) {  // inline (version 12): the entries, then their bytes
      ++tables;
      size_t n = f->header.a2, at = n * wire::kTableEntrySize;
      ASSERT_LE(at, f->payload.size());
      for (size_t k = 0; k < n; ++k) {
        wire::TableEntry e = wire::get_table_entry(f->payload.data() + k * wire::kTableEntrySize);
        ASSERT_EQ(e.key, 0u);
        ASSERT_LE(e.offset + e.length, want.size());
        ASSERT_LE(at + e.length, f->payload.size());
        std::copy_n(f->payload.begin() + static_cast<ptrdiff_t>(at), e.length,
                    got.begin() + static_cast<ptrdiff_t>(e.offset));
        at += e.length;
        landed += e.length;
      }
      ASSERT_EQ(at, f->payload.size());
      continue;
    }
    ASSERT_LE(f->header.a0 + f->payload.size(), want.size());
    std::copy(f->payload.begin(), f->payload.end(), got.begin() + static_cast<ptrdiff_t>(f->header.a0));
    landed += f->payload.size();
  }
  EXPECT_TRUE(got == want);
  EXPECT_GE(tables, 1u) << "the run of small segments did not come as an inline table";
  EXPECT_TRUE(ep->health().ok()) << ep->health().to_string();
  ::shutdown(peer->fd(), SHUT_RDWR);  // the raw peer ends first: the endpoint's close waits for no CLOSE
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
