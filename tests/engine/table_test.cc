// Table chunks (docs/wire.md "Tables", endpoint/tables.cc): a vectored write's run of small
// segments goes to a path that takes lists as one chunk. Over the memcpy test path (memcpy_path.h)
// between two contexts of this process: lists of every length around the 128-piece limit, odd sizes
// and offsets, several regions, big segments between lists, one notification after the last byte,
// checksummed endpoints (no tables), cancel, deadline, and a key the target does not know.
#include <gtest/gtest.h>

#include <random>

#include "engine/table_util.h"

namespace dmx::test {
namespace {

const MemSpec kSim{MemKind::kSim, 0};

// How many lists (and lone chunks) n small pieces make: 128 a list, a last piece alone a chunk.
uint64_t lists_for(size_t n) { return n / 128 + (n % 128 >= 2 ? 1 : 0); }
uint64_t lone_for(size_t n) { return n % 128 == 1 ? 1 : 0; }

// Lists of 0 to 100,000 small pieces (1-300 B) from sim memory (a device-like source, which no
// inline rule keeps off the path) into two regions, keys alternating entry by entry.
TEST(TableChunks, ListsOfEveryLengthLandByteExact) {
  TablePair p;
  table_pair(p);
  for (size_t n : {size_t(0), size_t(1), size_t(2), size_t(127), size_t(128), size_t(129), size_t(1000),
                   size_t(100000)}) {
    SCOPED_TRACE(n);
    uint64_t lists0 = p.hooks->lists_sent, pieces0 = p.hooks->pieces_sent, chunks0 = p.hooks->chunks_sent;
    uint64_t rx_lists0 = p.hooks->lists_received;
    WriteRun w;
    prepare(p, w, random_sizes(n, 1, 300), 2, kSim);
    Request req = start_write(p, w);
    expect_write_lands(p, w, req);
    EXPECT_EQ(p.hooks->lists_sent - lists0, lists_for(n));
    EXPECT_EQ(p.hooks->lists_received - rx_lists0, lists_for(n));
    EXPECT_EQ(p.hooks->pieces_sent - pieces0, n - lone_for(n));
    EXPECT_EQ(p.hooks->chunks_sent - chunks0, lone_for(n));
  }
  EXPECT_EQ(p.hooks->longest_list, 128u);
  EXPECT_TRUE(p.client.health().ok() && p.server.health().ok());
}

// 1,000 entries of 4 KiB: at most ceil(1000 / 128) list chunks carry them all.
TEST(TableChunks, AThousandBlocksOfFourKibInEightLists) {
  TablePair p;
  table_pair(p);
  WriteRun w;
  prepare(p, w, std::vector<uint64_t>(1000, 4096), 3, kSim);
  Request req = start_write(p, w);
  expect_write_lands(p, w, req);
  EXPECT_LE(p.hooks->lists_sent, (1000u + 127) / 128);
  EXPECT_EQ(p.hooks->pieces_sent, 1000u);
  EXPECT_EQ(p.hooks->chunks_sent, 0u);
  EXPECT_EQ(p.hooks->dropped, 0u);
}

// Odd sizes (1 B, 4095, 65537, ...) at odd offsets, and segments over 1 MiB among them: those go
// chunk by chunk (1 MiB, the path's max_chunk) between the lists. From host memory (where
// segments under 64 KiB that start a run go inline on the stream) and from sim memory.
TEST(TableChunks, OddSizesAndBigSegmentsBetweenLists) {
  const std::vector<uint64_t> pattern = {65537, 1, 4095, 65536, 3, (1 << 20) + 1, 70000, 4097, 1 << 20,
                                         (3 << 20) + 7, 100000, 2, 65537, 12345, 1};
  for (MemSpec where : {MemSpec{}, kSim}) {
    SCOPED_TRACE(to_string(where));
    TablePair p;
    table_pair(p);
    std::vector<uint64_t> sizes;
    for (int k = 0; k < 20; ++k) sizes.insert(sizes.end(), pattern.begin(), pattern.end());
    WriteRun w;
    prepare(p, w, sizes, 3, where);
    Request req = start_write(p, w);
    expect_write_lands(p, w, req);
    EXPECT_GT(p.hooks->lists_sent, 0u);
    // (1 MiB + 1) and (3 MiB + 7) once a round: at least 4 chunks of 1 MiB a round.
    EXPECT_GE(p.hooks->chunks_sent, 20u * 4);
  }
}

// A path that takes a prefix of what it is offered (cuda_ipc: the pieces of one allocation): the
// rest goes in the next list.
TEST(TableChunks, APathThatTakesAPrefix) {
  TablePair p;
  table_pair(p);
  p.hooks->take_at_most = 5;
  WriteRun w;
  prepare(p, w, random_sizes(1000, 1, 5000), 2, kSim);
  Request req = start_write(p, w);
  expect_write_lands(p, w, req);
  EXPECT_EQ(p.hooks->longest_list, 5u);
  EXPECT_EQ(p.hooks->lists_sent, 200u);
}

// A path that turns a list down (kUnavailable: not these sources) gets its pieces one by one.
TEST(TableChunks, APathThatTurnsAListDown) {
  TablePair p;
  table_pair(p);
  p.hooks->refuse_lists = true;
  WriteRun w;
  prepare(p, w, random_sizes(300, 1, 5000), 2, kSim);
  Request req = start_write(p, w);
  expect_write_lands(p, w, req);
  EXPECT_EQ(p.hooks->lists_sent, 0u);
  EXPECT_EQ(p.hooks->chunks_sent, 300u);
}

// With checksums on, a chunk's CRC covers one run of bytes: no table is sent, the bytes still come.
TEST(TableChunks, ChecksummedEndpointsSendNoTables) {
  TablePair p;
  Options o = table_options();
  o.set("checksum", "crc32c");
  table_pair(p, o);
  ASSERT_TRUE(p.client.stats().checksum);
  WriteRun w;
  prepare(p, w, random_sizes(1000, 1, 5000), 2, kSim);
  Request req = start_write(p, w);
  expect_write_lands(p, w, req);
  EXPECT_EQ(p.hooks->lists_sent, 0u);
  EXPECT_EQ(p.hooks->lists_received, 0u);
  EXPECT_EQ(p.hooks->chunks_sent, 1000u);
}

// The next write after a failed or cancelled one lands byte-exact: the endpoint goes on.
void expect_next_write_lands(TablePair& p) {
  p.hooks->copy_delay_us = 0;
  EXPECT_TRUE(p.client.health().ok()) << p.client.health().to_string();
  EXPECT_TRUE(p.server.health().ok()) << p.server.health().to_string();
  WriteRun w;
  prepare(p, w, random_sizes(700, 1, 4000), 2, kSim);
  Request req = start_write(p, w);
  expect_write_lands(p, w, req);
}

// Drains notifications of earlier writes that may still come; returns whether one had `value`.
bool drain_notifications(Endpoint& e, uint64_t value) {
  bool seen = false;
  for (auto n = e.next_notification(300ms); n.ok(); n = e.next_notification(300ms)) seen |= n->value == value;
  return seen;
}

// The target's path cannot take a list it was handed (not the peer's fault): that write fails
// with the path's reason, its other lists and the endpoint go on, the sender's window is not lost.
TEST(TableChunks, ATargetPathThatCannotTakeAList) {
  TablePair p;
  table_pair(p);
  p.hooks->rx_refuse = 1;
  WriteRun w;
  prepare(p, w, random_sizes(1000, 1, 3000), 2, kSim);
  Request req = start_write(p, w);
  Status st = req.wait(kEventually);
  EXPECT_NE(st.code(), Code::kTimeout) << "the write hung: " << st.to_string();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("refused (test hook)"), std::string::npos) << st.to_string();
  EXPECT_FALSE(drain_notifications(p.server, w.value)) << "a failed write notified";
  for (int k = 0; k < 3; ++k) expect_next_write_lands(p);  // more lists than a window's worth
}

// The same for a single chunk of a path whose receiver releases (cuda_ipc's kind): a write and a
// message whose chunk the target's path cannot take fail, and do not wait for ever for the chunk.
TEST(PathRefusal, AWriteWhoseChunkTheTargetPathCannotTake) {
  TablePair p;
  table_pair(p);
  p.hooks->rx_refuse_chunks = 1;
  Filled src = filled(MemSpec{}, (3 << 20) + 5);
  Buffer dst = poisoned(MemSpec{}, src.data.size());
  auto reg = p.a.register_memory(dst.region());
  ASSERT_TRUE(reg.ok());
  Status st = p.client.write(src.buf.region(), reg->remote(), 0).wait(kEventually);
  EXPECT_NE(st.code(), Code::kTimeout) << "the write hung: " << st.to_string();
  EXPECT_NE(st.message().find("refused (test hook)"), std::string::npos) << st.to_string();
  for (int k = 0; k < 2; ++k) {
    Filled again = filled(MemSpec{}, (3 << 20) + 5);
    ASSERT_TRUE(p.client.write(again.buf.region(), reg->remote(), 0).wait(kEventually).ok());
    EXPECT_EQ(read_back(dst.region()), again.data);
  }
  EXPECT_GT(p.hooks->chunks_received, 0u) << "not by the path";
}

TEST(PathRefusal, AMessageWhoseChunkTheReceiversPathCannotTake) {
  TablePair p;
  table_pair(p);
  p.hooks->rx_refuse_chunks = 1;
  Filled src = filled(MemSpec{}, (3 << 20) + 5);
  Buffer dst = poisoned(MemSpec{}, src.data.size());
  Request r = p.server.recv(dst.region(), 1);
  Request s = p.client.send(src.buf.region(), 1);
  Status rs = r.wait(kEventually), ss = s.wait(kEventually);
  EXPECT_NE(rs.code(), Code::kTimeout) << "the recv hung: " << rs.to_string();
  EXPECT_NE(ss.code(), Code::kTimeout) << "the send hung: " << ss.to_string();
  EXPECT_FALSE(rs.ok());
  // Named as every failed chunk is, whether the path refused it at once or failed it later.
  EXPECT_NE(rs.peer().find("127.0.0.1"), std::string::npos) << rs.to_string();
  if (!p.server.health().ok()) return;  // the endpoint failed: nothing more to send on it
  Filled again = filled(MemSpec{}, (3 << 20) + 5);
  Request r2 = p.server.recv(dst.region(), 2);
  ASSERT_TRUE(p.client.send(again.buf.region(), 2).wait(kEventually).ok());
  ASSERT_TRUE(r2.wait(kEventually).ok());
  EXPECT_EQ(read_back(dst.region()), again.data);
}

// A path that fails to send a chunk or a list at once (not kUnavailable) fails that operation,
// named as the receiver's refusals are: the endpoint's peer, not the path's own name for it.
TEST(PathRefusal, AChunkTheSendersPathFailsNamesTheEndpointsPeer) {
  TablePair p;
  table_pair(p);
  p.hooks->tx_fail = 1;
  Filled src = filled(MemSpec{}, (3 << 20) + 5);
  Buffer dst = poisoned(MemSpec{}, src.data.size());
  auto reg = p.a.register_memory(dst.region());
  ASSERT_TRUE(reg.ok());
  Status st = p.client.write(src.buf.region(), reg->remote(), 0).wait(kEventually);
  EXPECT_NE(st.code(), Code::kTimeout) << "the write hung: " << st.to_string();
  EXPECT_NE(st.message().find("send failed (test hook)"), std::string::npos) << st.to_string();
  EXPECT_NE(st.peer().find("127.0.0.1"), std::string::npos) << st.to_string();
  Filled again = filled(MemSpec{}, (3 << 20) + 5);
  ASSERT_TRUE(p.client.write(again.buf.region(), reg->remote(), 0).wait(kEventually).ok());
  EXPECT_EQ(read_back(dst.region()), again.data);
}

TEST(PathRefusal, AListTheSendersPathFailsNamesTheEndpointsPeer) {
  TablePair p;
  table_pair(p);
  p.hooks->tx_fail = 1;
  WriteRun w;
  prepare(p, w, random_sizes(1000, 1, 3000), 2, kSim);
  Status st = start_write(p, w).wait(kEventually);
  EXPECT_NE(st.code(), Code::kTimeout) << "the write hung: " << st.to_string();
  EXPECT_NE(st.message().find("send failed (test hook)"), std::string::npos) << st.to_string();
  EXPECT_NE(st.peer().find("127.0.0.1"), std::string::npos) << st.to_string();
  expect_next_write_lands(p);
}

TEST(PathRefusal, AnEagerMessageTheSendersPathFailsNamesTheEndpointsPeer) {
  TablePair p;
  table_pair(p);
  p.hooks->tx_fail = 1;
  Filled src = filled(MemSpec{}, 777);
  Buffer dst = poisoned(MemSpec{}, src.data.size());
  Request r = p.server.recv(dst.region(), 1);
  Status ss = p.client.send(src.buf.region(), 1).wait(kEventually);
  EXPECT_NE(ss.message().find("send failed (test hook)"), std::string::npos) << ss.to_string();
  EXPECT_NE(ss.peer().find("127.0.0.1"), std::string::npos) << ss.to_string();
  Request s2 = p.client.send(src.buf.region(), 1);  // the recv is still posted: this one fills it
  ASSERT_TRUE(s2.wait(kEventually).ok());
  ASSERT_TRUE(r.wait(kEventually).ok());
  EXPECT_EQ(read_back(dst.region()), src.data);
}

TEST(TableChunks, CancelMidway) {
  TablePair p;
  table_pair(p);
  p.hooks->copy_delay_us = 2000;  // each list takes 2 ms to copy: ~780 lists, over 1.5 s
  WriteRun w;
  prepare(p, w, random_sizes(100000, 1, 64), 2, kSim);
  Request req = start_write(p, w);
  for (auto until = Clock::now() + kEventually; p.hooks->lists_received < 20 && Clock::now() < until;)
    std::this_thread::sleep_for(1ms);
  ASSERT_GE(p.hooks->lists_received, 20u);
  req.cancel();
  Status st = req.wait(kEventually);
  EXPECT_EQ(st.code(), Code::kCancelled) << st.to_string();
  EXPECT_LT(p.hooks->lists_received, 700u) << "the cancel came too late to stop anything";
  EXPECT_FALSE(drain_notifications(p.server, w.value)) << "a cancelled write notified";
  expect_next_write_lands(p);
}

TEST(TableChunks, DeadlineOfABigVectoredWrite) {
  TablePair p;
  table_pair(p);
  p.hooks->copy_delay_us = 2000;
  WriteRun w;
  prepare(p, w, random_sizes(100000, 1, 64), 2, kSim);
  OpOptions o;
  o.timeout = 300ms;
  Request req = start_write(p, w, o);
  Status st = req.wait(kEventually);
  EXPECT_EQ(st.code(), Code::kTimeout) << st.to_string();
  EXPECT_FALSE(drain_notifications(p.server, w.value)) << "a write past its deadline notified";
  expect_next_write_lands(p);
}

// A key the target does not know, in the middle of a list (and in a later list of a long write):
// the write fails with kNotFound naming the key; the endpoint goes on.
TEST(TableChunks, UnknownKeyInTheMiddleOfAList) {
  TablePair p;
  table_pair(p);
  for (size_t bad_at : {size_t(50), size_t(700)}) {
    SCOPED_TRACE(bad_at);
    WriteRun w;
    prepare(p, w, random_sizes(1000, 1, 3000), 1, kSim);
    std::mt19937_64 rng(std::random_device{}());
    RemoteRegion bogus = w.remote[0];
    bogus.key = rng() | (uint64_t{1} << 63);
    w.remote.push_back(bogus);
    w.layout.entries[bad_at].remote = 1;  // within the real region's bounds (same size)
    uint64_t lists0 = p.hooks->lists_received;
    Request req = start_write(p, w);
    Status st = req.wait(kEventually);
    EXPECT_EQ(st.code(), Code::kNotFound) << st.to_string();
    EXPECT_NE(st.message().find(fmt::format("0x{:x}", bogus.key)), std::string::npos) << st.to_string();
    EXPECT_GT(p.hooks->lists_received, lists0);
    EXPECT_FALSE(drain_notifications(p.server, w.value)) << "a refused write notified";
    expect_next_write_lands(p);
  }
}

}  // namespace
}  // namespace dmx::test
