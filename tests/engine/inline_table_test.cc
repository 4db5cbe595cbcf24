// Inline table chunks (docs/wire.md "Tables", versions 11 and 12): a vectored write's run of small
// segments on a TCP stream as one WRITE_DATA frame, its table and then the pieces' bytes, which
// the target's stream scatters (host memory in place; device memory through one staging slot);
// a vectored read's reply the same way, as READ_DATA (its hostile side: table_read_test.cc).
//
// Two real endpoints over TCP alone check delivery; a raw peer sends inline tables it made
// itself, true and lying: a liar is closed with a message naming it, no byte lands, and the
// listener's other endpoints go on.
#include <gtest/gtest.h>

#include <sys/socket.h>

#include "engine/table_util.h"
#include "hostile/hostile_util.h"
#include "memory/sim_device.h"

namespace dmx::test {
namespace {

using wire::FrameHeader;
using wire::FrameType;

const MemSpec kSimMem{MemKind::kSim, 0};

Options tcp_options() {
  Options o = test_options(1);
  o.set("transport", "tcp");
  return o;
}

struct TcpPair {
  Context a, b;  // a listens (the target)
  Listener listener;
  Endpoint client, server;
};

void tcp_pair(TcpPair& p, const Options& o = tcp_options()) {
  auto a = Context::create(o), b = Context::create(o);
  ASSERT_TRUE(a.ok() && b.ok());
  p.a = *a;
  p.b = *b;
  auto l = p.a.listen("tcp://127.0.0.1:0");
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  p.listener = std::move(*l);
  auto c = p.b.connect(p.listener.address());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  p.client = std::move(*c);
  auto s = p.listener.accept(kEventually);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  p.server = std::move(*s);
  ASSERT_EQ(p.client.stats().transport, "tcp");
}

// One vectored write of `sizes` from `src_where` into `regions` regions of `dst_where` kinds
// (region r is of kind dst_where[r % size]); every byte of every region checked, poison between.
// Returns the bytes the target received beyond the data: 20 a piece that came in a table.
uint64_t write_lands(TcpPair& p, const std::vector<uint64_t>& sizes, uint32_t regions, MemSpec src_where,
                     const std::vector<MemSpec>& dst_where) {
  std::mt19937_64 rng(std::random_device{}());
  Layout l = make_layout(sizes, regions, rng);
  Filled src = filled(src_where, l.local_size);
  std::vector<Buffer> targets;
  std::vector<Registration> regs;
  std::vector<RemoteRegion> remote;
  for (uint32_t r = 0; r < regions; ++r) {
    targets.push_back(poisoned(dst_where[r % dst_where.size()], l.region_size[r]));
    auto reg = p.a.register_memory(targets.back().region());
    EXPECT_TRUE(reg.ok()) << reg.status().to_string();
    if (!reg.ok()) return 0;
    remote.push_back(reg->remote());
    regs.push_back(std::move(*reg));
  }
  uint64_t before = p.server.stats().bytes_received;
  OpOptions o;
  o.notify = true;
  o.notify_value = rng() | 1;
  MemRegion local[] = {src.buf.region()};
  Request req = p.client.write_vec(local, remote, l.entries, o);
  auto note = p.server.next_notification(kEventually);
  EXPECT_TRUE(note.ok()) << note.status().to_string() << " / write: " << req.status().to_string();
  if (!note.ok()) return 0;
  EXPECT_EQ(note->value, o.notify_value);
  std::vector<std::vector<unsigned char>> got;
  for (const Buffer& b : targets) got.push_back(read_back(b.region()));
  expect_landed(l, src.data, got);  // at the notification: all there
  Status st = req.wait(kEventually);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return p.server.stats().bytes_received - before - l.total;
}

TEST(InlineTables, SmallHostBlocksComeAsTables) {
  TcpPair p;
  tcp_pair(p);
  // 3,000 blocks of 1 B to 5 KiB: every one in a table (20 bytes of entry each on the wire).
  EXPECT_EQ(write_lands(p, random_sizes(3000, 1, 5000), 3, MemSpec{}, {MemSpec{}}), 3000u * wire::kTableEntrySize);
}

TEST(InlineTables, SimDeviceBlocksScatterThroughASlot) {
  TcpPair p;
  tcp_pair(p);
  EXPECT_EQ(write_lands(p, random_sizes(2000, 1, 3000), 2, kSimMem, {kSimMem}), 2000u * wire::kTableEntrySize);
  EXPECT_GT(p.client.stats().d2h_copies, 0u) << "the sim source was not staged";
  EXPECT_GT(p.server.stats().h2d_copies, 0u) << "the sim destinations were not copied from a slot";
  EXPECT_GT(p.client.stats().staging_lists, 0u) << "the pieces were not gathered as one list";
  EXPECT_GT(p.server.stats().staging_lists, 0u) << "the pieces were not scattered as one list";
}

// A table whose pieces land on two devices: a list for each, the plan's fence after both.
TEST(InlineTables, PiecesOnTwoDevicesScatterAsAListEach) {
  TcpPair p;
  tcp_pair(p);
  EXPECT_EQ(write_lands(p, random_sizes(2000, 1, 3000), 4, kSimMem, {kSimMem, MemSpec{MemKind::kSim, 1}, MemSpec{}}),
            2000u * wire::kTableEntrySize);
  // The sender gathers each table from one device; the target scatters it to two (a short last
  // table may hold a single piece for one of them, which goes as a copy, not a list).
  EXPECT_GT(p.client.stats().staging_lists, 1u);
  EXPECT_GE(p.server.stats().staging_lists, 2 * p.client.stats().staging_lists - 1);
}

// A queue that cannot copy a list (a CUDA device whose kernels do not load): the same bytes
// land, a copy per piece.
TEST(InlineTables, AQueueThatRefusesListsCopiesPieceByPiece) {
  TcpPair p;
  tcp_pair(p);
  sim_refuse_lists(true);
  uint64_t extra = write_lands(p, random_sizes(2000, 1, 3000), 2, kSimMem, {kSimMem, MemSpec{}});
  sim_refuse_lists(false);
  EXPECT_EQ(extra, 2000u * wire::kTableEntrySize);
  EXPECT_EQ(p.client.stats().staging_lists + p.server.stats().staging_lists, 0u);
  EXPECT_GE(p.client.stats().d2h_copies, 2000u);
  EXPECT_GT(p.server.stats().h2d_copies, 100u);
}

TEST(InlineTables, OneTableOverHostAndDeviceRegions) {
  TcpPair p;
  tcp_pair(p);
  // Entries alternate region by region, and regions alternate kinds: each table mixes them.
  EXPECT_EQ(write_lands(p, random_sizes(1000, 1, 2000), 4, MemSpec{}, {MemSpec{}, kSimMem}),
            1000u * wire::kTableEntrySize);
}

// Segments past a table's piece limit (1 MiB) or a chunk go chunk by chunk, those between them
// in tables; the lengths cross every boundary.
TEST(InlineTables, LargeSegmentsBetweenSmallOnes) {
  TcpPair p;
  tcp_pair(p);
  std::vector<uint64_t> sizes = {1, 100, (1 << 20) + 1, 7, 9, 3 << 20, 1 << 20, (1 << 20) - 1, 4000, 1};
  uint64_t extra = write_lands(p, sizes, 2, MemSpec{}, {MemSpec{}});
  EXPECT_GE(extra, 2u * wire::kTableEntrySize);
  EXPECT_EQ(extra % wire::kTableEntrySize, 0u);
}

// One vectored read of `sizes` from `regions` regions at the target (region r of kind
// src_where[r % size]) into one buffer of kind `dst_where`; every byte checked, poison between.
// Returns the bytes the reader received beyond the data: 20 a piece that came in a table.
uint64_t read_lands(TcpPair& p, const std::vector<uint64_t>& sizes, uint32_t regions,
                    const std::vector<MemSpec>& src_where, MemSpec dst_where) {
  std::mt19937_64 rng(std::random_device{}());
  Layout l = make_layout(sizes, regions, rng);
  std::vector<Filled> sources;
  std::vector<Registration> regs;
  std::vector<RemoteRegion> remote;
  for (uint32_t r = 0; r < regions; ++r) {
    sources.push_back(filled(src_where[r % src_where.size()], l.region_size[r]));
    auto reg = p.a.register_memory(sources.back().buf.region());
    EXPECT_TRUE(reg.ok()) << reg.status().to_string();
    if (!reg.ok()) return 0;
    remote.push_back(reg->remote());
    regs.push_back(std::move(*reg));
  }
  Buffer dst = poisoned(dst_where, l.local_size);
  uint64_t before = p.client.stats().bytes_received;
  MemRegion local[] = {dst.region()};
  Request req = p.client.read_vec(local, remote, l.entries);
  Status st = req.wait(kEventually);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(req.bytes(), l.total);
  expect_read_landed(l, sources, read_back(dst.region()));
  return p.client.stats().bytes_received - before - l.total;
}

// Version 12: a vectored read's reply comes as inline tables too.
TEST(InlineTables, SmallHostBlocksReadBackAsTables) {
  TcpPair p;
  tcp_pair(p);
  EXPECT_EQ(read_lands(p, random_sizes(3000, 1, 5000), 3, {MemSpec{}}, MemSpec{}), 3000u * wire::kTableEntrySize);
}

TEST(InlineTables, SimDeviceBlocksReadBackThroughASlot) {
  TcpPair p;
  tcp_pair(p);
  EXPECT_EQ(read_lands(p, random_sizes(2000, 1, 3000), 2, {kSimMem}, kSimMem), 2000u * wire::kTableEntrySize);
  EXPECT_GT(p.server.stats().staging_lists, 0u) << "the target did not gather its pieces as one list";
  EXPECT_GT(p.client.stats().staging_lists, 0u) << "the reader did not scatter its pieces as one list";
}

// Segments past a table's limits between small ones, a read of no entries and of one, and the
// reader's host memory from the target's device memory and back (a read's regions are of one
// kind: the target refuses a mix).
TEST(InlineTables, ReadsOfOddShapes) {
  TcpPair p;
  tcp_pair(p);
  std::vector<uint64_t> sizes = {1, 100, (1 << 20) + 1, 7, 9, 3 << 20, 1 << 20, (1 << 20) - 1, 4000, 1};
  uint64_t extra = read_lands(p, sizes, 2, {kSimMem}, MemSpec{});
  EXPECT_GE(extra, 2u * wire::kTableEntrySize);
  EXPECT_EQ(extra % wire::kTableEntrySize, 0u);
  EXPECT_EQ(read_lands(p, {}, 1, {MemSpec{}}, MemSpec{}), 0u);
  EXPECT_EQ(read_lands(p, {4321}, 1, {kSimMem}, MemSpec{}), 0u);  // one segment: a plain chunk
  EXPECT_EQ(read_lands(p, random_sizes(500, 1, 3000), 1, {MemSpec{}}, kSimMem), 500u * wire::kTableEntrySize);
  EXPECT_TRUE(p.client.health().ok() && p.server.health().ok());
}

TEST(InlineTables, ChecksummedEndpointsSendNone) {
  TcpPair p;
  Options o = tcp_options();
  o.set("checksum", "crc32c");
  tcp_pair(p, o);
  EXPECT_EQ(write_lands(p, random_sizes(500, 1, 3000), 2, MemSpec{}, {MemSpec{}}), 0u);
  EXPECT_EQ(read_lands(p, random_sizes(500, 1, 3000), 2, {MemSpec{}}, MemSpec{}), 0u);
}

// ---- a raw peer's inline tables ----

// WRITE_DATA VECTOR|TABLE on path 0: the table, then `bytes` (normally the pieces' bytes).
std::pair<FrameHeader, std::vector<unsigned char>> inline_table(uint64_t id, uint64_t total,
                                                                const std::vector<Piece>& pieces,
                                                                const std::vector<unsigned char>& bytes) {
  FrameHeader h;
  h.type = FrameType::kWriteData;
  h.flags = wire::kFlagVector | wire::kFlagTable | wire::kFlagNotify;
  h.id = id;
  h.a0 = pieces.size();
  h.a2 = total;
  h.a3 = 99;
  std::vector<unsigned char> payload = table_entries(pieces);
  payload.insert(payload.end(), bytes.begin(), bytes.end());
  h.payload_len = static_cast<uint32_t>(payload.size());
  return {h, payload};
}

std::vector<unsigned char> random_bytes(size_t n) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<unsigned char> b(n);
  for (auto& c : b) c = static_cast<unsigned char>(rng());
  return b;
}

struct Target {
  Server s;
  Buffer a, b;
  uint64_t key_a = 0, key_b = 0;
  std::vector<Registration> regs;
};

void make_target(Target& t, Options o = tcp_options()) {
  t.s = make_server(o);
  t.a = poisoned(MemSpec{}, 4096);
  t.b = poisoned(kSimMem, 4096);
  auto ra = t.s.ctx.register_memory(t.a.region());
  auto rb = t.s.ctx.register_memory(t.b.region());
  ASSERT_TRUE(ra.ok() && rb.ok());
  t.key_a = ra->remote().key;
  t.key_b = rb->remote().key;
  t.regs.push_back(std::move(*ra));
  t.regs.push_back(std::move(*rb));
}

void expect_untouched(Target& t) {
  for (unsigned char c : read_back(t.a.region())) ASSERT_EQ(c, 0xA5) << "a lying table touched a region";
  for (unsigned char c : read_back(t.b.region())) ASSERT_EQ(c, 0xA5) << "a lying table touched a region";
}

using Frames = std::vector<std::pair<FrameHeader, std::vector<unsigned char>>>;

void expect_closed(Target& t, const Frames& frames, const std::string& words) {
  auto peer = RawPeer::connect(t.s.listener.address(), kHostileKey);
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  auto ep = t.s.listener.accept(10s);
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  for (const auto& [h, payload] : frames) (void)peer->send(h, payload);
  Status st = wait_for_failure(*ep, kEventually);
  EXPECT_EQ(st.code(), Code::kProtocol) << st.to_string();
  EXPECT_NE(st.message().find(words), std::string::npos) << st.to_string();
  EXPECT_FALSE(st.peer().empty()) << "the error must name the peer: " << st.to_string();
  expect_untouched(t);
  expect_serves_a_good_client(t.s);
}

TEST(InlineTableHostile, AGoodTableLandsInHostAndDeviceMemory) {  // the seam itself works
  Target t;
  make_target(t);
  auto peer = RawPeer::connect(t.s.listener.address(), kHostileKey);
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  auto ep = t.s.listener.accept(10s);
  ASSERT_TRUE(ep.ok());
  std::vector<unsigned char> bytes = random_bytes(130);
  auto f = inline_table(1, 130, {{t.key_a, 10, 100}, {t.key_b, 4066, 30}}, bytes);
  ASSERT_TRUE(peer->send(f.first, f.second).ok());
  auto note = ep->next_notification(kEventually);
  ASSERT_TRUE(note.ok()) << note.status().to_string() << " " << ep->health().to_string();
  EXPECT_EQ(note->value, 99u);
  auto a = read_back(t.a.region()), b = read_back(t.b.region());
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.begin() + 100, a.begin() + 10));
  EXPECT_TRUE(std::equal(bytes.begin() + 100, bytes.end(), b.begin() + 4066));
  EXPECT_EQ(a[9], 0xA5);
  EXPECT_EQ(a[110], 0xA5);
  EXPECT_EQ(b[4065], 0xA5);
  EXPECT_TRUE(ep->health().ok()) << ep->health().to_string();
  ::shutdown(peer->fd(), SHUT_RDWR);  // the raw peer ends first: the endpoint's close waits for no CLOSE
}

TEST(InlineTableHostile, PiecesSumToLessThanTheBytesThatFollow) {
  Target t;
  make_target(t);
  expect_closed(t, {inline_table(1, 100, {{t.key_a, 0, 40}, {t.key_a, 100, 40}}, random_bytes(81))},
                "an inline table's pieces sum to 80 bytes; 81 follow it");
}

TEST(InlineTableHostile, PiecesSumToMoreThanTheBytesThatFollow) {
  Target t;
  make_target(t);
  expect_closed(t, {inline_table(1, 100, {{t.key_a, 0, 40}, {t.key_a, 100, 40}}, random_bytes(79))},
                "an inline table's pieces sum to 80 bytes; 79 follow it");
}

TEST(InlineTableHostile, PieceOfLengthZero) {
  Target t;
  make_target(t);
  expect_closed(t, {inline_table(1, 100, {{t.key_a, 0, 50}, {t.key_a, 100, 0}, {t.key_a, 200, 50}}, random_bytes(100))},
                "table piece 1 of 0 bytes");
}

TEST(InlineTableHostile, PiecesSumPastTheWrite) {
  Target t;
  make_target(t);
  expect_closed(t, {inline_table(1, 100, {{t.key_a, 0, 60}, {t.key_a, 100, 60}}, random_bytes(120))},
                "table piece 1 of 60 bytes (the write has 40 bytes left)");
}

TEST(InlineTableHostile, OffsetPastADeviceRegion) {
  Target t;
  make_target(t);
  expect_closed(t, {inline_table(1, 100, {{t.key_a, 0, 50}, {t.key_b, 4050, 50}}, random_bytes(100))},
                "lies outside the 4096-byte region");
}

TEST(InlineTableHostile, OffsetPlusLengthOverflows) {
  Target t;
  make_target(t);
  expect_closed(t, {inline_table(1, 100, {{t.key_a, 0, 50}, {t.key_a, UINT64_MAX - 20, 50}}, random_bytes(100))},
                "lies outside the 4096-byte region");
}

TEST(InlineTableHostile, TableInAChecksummedSession) {
  Target t;
  Options o = tcp_options();
  o.set("checksum", "crc32c");
  make_target(t, o);
  expect_closed(t, {inline_table(1, 20, {{t.key_a, 0, 10}, {t.key_a, 100, 10}}, random_bytes(20))},
                "lacks a checksum, but the handshake agreed crc32c");
}

// An unknown key is the writer's mistake, not a lie: ACK(not found), nothing lands, the endpoint
// stays up and takes the next write.
TEST(InlineTableHostile, UnknownKeyIsRefusedAndTheEndpointGoesOn) {
  Target t;
  make_target(t);
  auto peer = RawPeer::connect(t.s.listener.address(), kHostileKey);
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  auto ep = t.s.listener.accept(10s);
  ASSERT_TRUE(ep.ok());
  auto f = inline_table(1, 100, {{t.key_a, 0, 50}, {t.key_b + 1000, 0, 50}}, random_bytes(100));
  ASSERT_TRUE(peer->send(f.first, f.second).ok());
  bool acked = false;
  for (int k = 0; k < 20 && !acked; ++k) {
    auto got = peer->read(0);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    if (got->header.type != FrameType::kAck) continue;
    acked = true;
    EXPECT_EQ(got->header.id, 1u);
    EXPECT_EQ(got->header.a0, static_cast<uint64_t>(Code::kNotFound));
  }
  EXPECT_TRUE(acked);
  expect_untouched(t);
  EXPECT_TRUE(ep->health().ok()) << ep->health().to_string();
  std::vector<unsigned char> bytes = random_bytes(30);
  auto good = inline_table(2, 30, {{t.key_a, 5, 10}, {t.key_a, 50, 20}}, bytes);
  ASSERT_TRUE(peer->send(good.first, good.second).ok());
  auto note = ep->next_notification(kEventually);
  ASSERT_TRUE(note.ok()) << note.status().to_string() << " " << ep->health().to_string();
  auto a = read_back(t.a.region());
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.begin() + 10, a.begin() + 5));
  EXPECT_TRUE(std::equal(bytes.begin() + 10, bytes.end(), a.begin() + 50));
  ::shutdown(peer->fd(), SHUT_RDWR);  // the raw peer ends first: the endpoint's close waits for no CLOSE
}

}  // namespace
}  // namespace dmx::test
