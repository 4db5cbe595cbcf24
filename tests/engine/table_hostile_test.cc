// Table chunks from a hostile peer (endpoint/tables.cc on_table_header, and the path's list
// descriptor): a table that lies about its pieces, a descriptor that disagrees with the table, more
// pieces than the path takes, a table on a path that takes none. The target closes that peer with a
// message naming it and the lie; no byte lands; other endpoints of the same listener go on.
//
// Two seams: a raw peer (engine/raw_peer.h) that agreed the memcpy path and sends TABLE frames it
// made itself, and the memcpy path's sender hooks (MemcpyHooks::lie) between two real endpoints.
#include <gtest/gtest.h>

#include <sys/socket.h>

#include "engine/table_util.h"
#include "hostile/hostile_util.h"

namespace dmx::test {
namespace {

using wire::FrameHeader;
using wire::FrameType;

// A TABLE frame: header, the table, and the memcpy path's descriptor of `srcs`.
std::pair<FrameHeader, std::vector<unsigned char>> table_frame(uint8_t path, uint64_t id, uint64_t total,
                                                               const std::vector<Piece>& pieces,
                                                               const std::vector<MemRegion>& srcs,
                                                               uint64_t n = 0) {
  FrameHeader h;
  h.type = FrameType::kWriteData;
  h.flags = wire::kFlagVector | wire::kFlagTable | wire::kFlagNotify;
  h.path = path;
  h.id = id;
  h.a0 = n != 0 ? n : pieces.size();
  h.a2 = total;
  h.a3 = 99;
  std::vector<unsigned char> payload = table_entries(pieces);
  auto desc = memcpy_path::encode(srcs.empty() ? MemSpec{} : srcs[0].where, srcs);
  payload.insert(payload.end(), desc.begin(), desc.end());
  h.payload_len = static_cast<uint32_t>(payload.size());
  return {h, payload};
}

struct Target {
  std::shared_ptr<MemcpyHooks> hooks = std::make_shared<MemcpyHooks>();
  Server s;
  Buffer a, b;
  uint64_t key_a = 0, key_b = 0;
  std::vector<Registration> regs;
  Filled src;  // the raw peer's memory its descriptors name
};

void make_target(Target& t, Options o = table_options()) {
  t.s = make_server(o);
  t.s.ctx.impl()->register_transport(make_memcpy_transport(t.hooks, kTableTransport));
  t.a = poisoned(MemSpec{}, 4096);
  t.b = poisoned(MemSpec{}, 4096);
  auto ra = t.s.ctx.register_memory(t.a.region());
  auto rb = t.s.ctx.register_memory(t.b.region());
  ASSERT_TRUE(ra.ok() && rb.ok());
  t.key_a = ra->remote().key;
  t.key_b = rb->remote().key;
  t.regs.push_back(std::move(*ra));
  t.regs.push_back(std::move(*rb));
  t.src = filled(MemSpec{}, 8192);
}

MemRegion src_at(Target& t, uint64_t offset, uint64_t len) { return t.src.buf.region().sub(offset, len); }

// Sends `frames` from a raw peer that agreed memcpy; returns the server endpoint's error, which
// must name the peer and `words`; then no byte of the target regions changed and a good client
// still writes.
using Frames = std::vector<std::pair<FrameHeader, std::vector<unsigned char>>>;

// `make(path, tcp)`: the frames, given memcpy's path id and tcp's.
// `untouched`: no frame before the lie was good, so no byte may have landed.
void expect_closed(Target& t, std::function<Frames(uint8_t, uint8_t)> make, const std::string& words,
                   bool untouched = true) {
  auto peer = RawPeer::connect(t.s.listener.address(), kHostileKey, 1, false,
                               {wire::Offer{"tcp", {1}}, wire::Offer{kTableTransport, {1}}});
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  uint8_t path = peer->path_id(kTableTransport);
  ASSERT_NE(path, 0) << "the server did not agree the memcpy path";
  auto ep = t.s.listener.accept(10s);
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  for (const auto& [h, payload] : make(path, peer->path_id("tcp"))) ASSERT_TRUE(peer->send(h, payload).ok());
  Status st = wait_for_failure(*ep, kEventually);
  EXPECT_EQ(st.code(), Code::kProtocol) << st.to_string();
  EXPECT_NE(st.message().find(words), std::string::npos) << st.to_string();
  EXPECT_FALSE(st.peer().empty()) << "the error must name the peer: " << st.to_string();
  if (untouched) {
    for (unsigned char c : read_back(t.a.region())) ASSERT_EQ(c, 0xA5) << "a lying table touched a region";
    for (unsigned char c : read_back(t.b.region())) ASSERT_EQ(c, 0xA5) << "a lying table touched a region";
  }
  expect_serves_a_good_client(t.s);
}

TEST(TableHostile, AGoodTableFromTheRawPeerLands) {  // the seam itself works
  Target t;
  make_target(t);
  auto peer = RawPeer::connect(t.s.listener.address(), kHostileKey, 1, false,
                               {wire::Offer{"tcp", {1}}, wire::Offer{kTableTransport, {1}}});
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  uint8_t path = peer->path_id(kTableTransport);
  ASSERT_NE(path, 0);
  auto ep = t.s.listener.accept(10s);
  ASSERT_TRUE(ep.ok());
  auto f = table_frame(path, 1, 130, {{t.key_a, 10, 100}, {t.key_b, 4000, 30}},
                       {src_at(t, 1, 100), src_at(t, 3001, 30)});
  ASSERT_TRUE(peer->send(f.first, f.second).ok());
  auto note = ep->next_notification(kEventually);
  ASSERT_TRUE(note.ok()) << note.status().to_string() << " " << ep->health().to_string();
  EXPECT_EQ(note->value, 99u);
  auto a = read_back(t.a.region()), b = read_back(t.b.region());
  EXPECT_TRUE(std::equal(t.src.data.begin() + 1, t.src.data.begin() + 101, a.begin() + 10));
  EXPECT_TRUE(std::equal(t.src.data.begin() + 3001, t.src.data.begin() + 3031, b.begin() + 4000));
  EXPECT_EQ(a[9], 0xA5);
  EXPECT_EQ(a[110], 0xA5);
  EXPECT_EQ(b[3999], 0xA5);
  EXPECT_TRUE(ep->health().ok()) << ep->health().to_string();
  ::shutdown(peer->fd(), SHUT_RDWR);  // the raw peer ends first: the endpoint's close waits for no CLOSE
}

TEST(TableHostile, PieceOfLengthZero) {
  Target t;
  make_target(t);
  expect_closed(t, [&](uint8_t path, uint8_t) {
    return std::vector{table_frame(path, 1, 100, {{t.key_a, 0, 50}, {t.key_a, 100, 0}, {t.key_a, 200, 50}},
                                   {src_at(t, 0, 50), src_at(t, 50, 50), src_at(t, 100, 50)})};
  }, "table piece 1 of 0 bytes");
}

TEST(TableHostile, PiecesSumPastTheWrite) {
  Target t;
  make_target(t);
  expect_closed(t, [&](uint8_t path, uint8_t) {
    return std::vector{table_frame(path, 1, 100, {{t.key_a, 0, 60}, {t.key_a, 100, 60}},
                                   {src_at(t, 0, 60), src_at(t, 60, 60)})};
  }, "table piece 1 of 60 bytes (the write has 40 bytes left)");
}

TEST(TableHostile, PiecesSumPastTheWriteOverTwoTables) {
  Target t;
  make_target(t);
  expect_closed(t, [&](uint8_t path, uint8_t) {
    return std::vector{table_frame(path, 1, 100, {{t.key_a, 0, 40}, {t.key_a, 100, 40}},
                                   {src_at(t, 0, 40), src_at(t, 40, 40)}),
                       table_frame(path, 1, 100, {{t.key_a, 300, 10}, {t.key_a, 400, 11}},
                                   {src_at(t, 0, 10), src_at(t, 40, 11)})};
  }, "(the write has 10 bytes left)", /*untouched=*/false);  // the first table was good
}

TEST(TableHostile, OffsetPastTheRegion) {
  Target t;
  make_target(t);
  expect_closed(t, [&](uint8_t path, uint8_t) {
    return std::vector{table_frame(path, 1, 100, {{t.key_a, 0, 50}, {t.key_b, 4050, 50}},
                                   {src_at(t, 0, 50), src_at(t, 50, 50)})};
  }, "lies outside the 4096-byte region");
}

TEST(TableHostile, OffsetPlusLengthOverflows) {
  Target t;
  make_target(t);
  expect_closed(t, [&](uint8_t path, uint8_t) {
    return std::vector{table_frame(path, 1, 100, {{t.key_a, 0, 50}, {t.key_b, UINT64_MAX - 20, 50}},
                                   {src_at(t, 0, 50), src_at(t, 50, 50)})};
  }, "lies outside");
}

TEST(TableHostile, DescriptorCountDisagreesWithTheTable) {
  Target t;
  make_target(t);
  expect_closed(t, [&](uint8_t path, uint8_t) {
    auto f = table_frame(path, 1, 90, {{t.key_a, 0, 30}, {t.key_a, 100, 30}, {t.key_a, 200, 30}},
                         {src_at(t, 0, 30), src_at(t, 30, 30)});  // two pieces described, three in the table
    return std::vector{f};
  }, "the descriptor names 2 pieces, the table 3");
}

TEST(TableHostile, DescriptorLengthDisagreesWithTheTable) {
  Target t;
  make_target(t);
  expect_closed(t, [&](uint8_t path, uint8_t) {
    return std::vector{table_frame(path, 1, 60, {{t.key_a, 0, 30}, {t.key_a, 100, 30}},
                                   {src_at(t, 0, 30), src_at(t, 30, 31)})};
  }, "piece 1 is 31 B, the table says 30 B");
}

TEST(TableHostile, MorePiecesThanThePathTakes) {
  Target t;
  make_target(t);
  t.hooks->max_list = 4;
  expect_closed(t, [&](uint8_t path, uint8_t) {
    std::vector<Piece> pieces;
    std::vector<MemRegion> srcs;
    for (uint32_t k = 0; k < 5; ++k) {
      pieces.push_back({t.key_a, k * 100u, 10});
      srcs.push_back(src_at(t, k * 10u, 10));
    }
    return std::vector{table_frame(path, 1, 50, pieces, srcs)};
  }, "5 pieces by rdma, which takes 4 at most");
}

// The wire's limits on a table's bytes (docs/wire.md "Tables"), which the decoder cannot see.
TEST(TableHostile, PieceOverTheWiresLimit) {
  Target t;
  make_target(t);
  Buffer big = poisoned(MemSpec{}, 2 * wire::kMaxTablePiece);
  auto reg = t.s.ctx.register_memory(big.region());
  ASSERT_TRUE(reg.ok());
  Filled src = filled(MemSpec{}, 2 * wire::kMaxTablePiece);
  uint64_t key = reg->remote().key;
  auto len = static_cast<uint32_t>(wire::kMaxTablePiece + 1);
  expect_closed(t, [&](uint8_t path, uint8_t) {
    return std::vector{table_frame(path, 1, 10 + len, {{t.key_a, 0, 10}, {key, 0, len}},
                                   {src_at(t, 0, 10), src.buf.region().sub(0, len)})};
  }, "table piece 1 of 1048577 bytes makes 1048587 in the table (at most 1048576 a piece, 33554432 a table)");
  for (unsigned char c : read_back(big.region())) ASSERT_EQ(c, 0xA5) << "a piece over the limit landed";
}

TEST(TableHostile, TableOverTheWiresLimit) {  // 33 pieces of 1 MiB, each one the path would take
  Target t;
  make_target(t);
  Buffer big = poisoned(MemSpec{}, wire::kMaxTablePiece);
  auto reg = t.s.ctx.register_memory(big.region());
  ASSERT_TRUE(reg.ok());
  Filled src = filled(MemSpec{}, wire::kMaxTablePiece);
  uint64_t key = reg->remote().key;
  size_t n = wire::kMaxTableBytes / wire::kMaxTablePiece + 1;
  expect_closed(t, [&](uint8_t path, uint8_t) {
    std::vector<Piece> pieces(n, Piece{key, 0, static_cast<uint32_t>(wire::kMaxTablePiece)});
    std::vector<MemRegion> srcs(n, src.buf.region());
    return std::vector{table_frame(path, 1, n * wire::kMaxTablePiece, pieces, srcs)};
  }, "table piece 32 of 1048576 bytes makes 34603008 in the table");
  for (unsigned char c : read_back(big.region())) ASSERT_EQ(c, 0xA5) << "a table over the limit landed";
}

TEST(TableHostile, TableOnAPathThatTakesNoLists) {
  Target t;
  make_target(t);
  t.hooks->max_list = 0;
  expect_closed(t, [&](uint8_t path, uint8_t) {
    return std::vector{table_frame(path, 1, 20, {{t.key_a, 0, 10}, {t.key_a, 100, 10}},
                                   {src_at(t, 0, 10), src_at(t, 10, 10)})};
  }, "which takes 0 at most");
}

TEST(TableHostile, TableOnAPathNotAgreed) {
  Target t;
  make_target(t);
  expect_closed(t, [&](uint8_t path, uint8_t) {
    return std::vector{table_frame(static_cast<uint8_t>(path + 1), 1, 20, {{t.key_a, 0, 10}, {t.key_a, 100, 10}},
                                   {src_at(t, 0, 10), src_at(t, 10, 10)})};
  }, "which was not agreed");
}

TEST(TableHostile, TableFrameTheDecoderRefuses) {  // a0 = 129: frame.cc, before the endpoint
  Target t;
  make_target(t);
  expect_closed(t, [&](uint8_t path, uint8_t) {
    std::vector<Piece> pieces;
    std::vector<MemRegion> srcs;
    for (uint32_t k = 0; k < 129; ++k) {
      pieces.push_back({t.key_a, k * 10u, 10});
      srcs.push_back(src_at(t, k * 10u, 10));
    }
    auto f = table_frame(path, 1, 1290, pieces, srcs);
    f.second.resize(129 * wire::kTableEntrySize + 8);  // the descriptor would not fit the frame
    f.first.payload_len = static_cast<uint32_t>(f.second.size());
    return std::vector{f};
  }, "129 pieces");
}

// A checksummed session (the server asks for it): a table, which carries no CRC, is refused.
TEST(TableHostile, TableInAChecksummedSession) {
  Target t;
  Options o = table_options();
  o.set("checksum", "crc32c");
  make_target(t, o);
  expect_closed(t, [&](uint8_t path, uint8_t) {
    return std::vector{table_frame(path, 1, 20, {{t.key_a, 0, 10}, {t.key_a, 100, 10}},
                                   {src_at(t, 0, 10), src_at(t, 10, 10)})};
  }, "lacks a checksum, but the handshake agreed crc32c");
}

// A changed form mid-write: a plain vectored chunk's write continued by a table of another length.
TEST(TableHostile, TableChangesTheWritesLength) {
  Target t;
  make_target(t);
  expect_closed(t, [&](uint8_t path, uint8_t) {
    return std::vector{table_frame(path, 1, 100, {{t.key_a, 0, 20}, {t.key_a, 100, 20}},
                                   {src_at(t, 0, 20), src_at(t, 20, 20)}),
                       table_frame(path, 1, 200, {{t.key_a, 300, 20}, {t.key_a, 400, 20}},
                                   {src_at(t, 0, 20), src_at(t, 20, 20)})};
  }, "changed its form or length", /*untouched=*/false);  // the first table was good
}

// ---- the sender's path lies (two real endpoints) ----

void expect_lie_closes(MemcpyLie lie, const std::string& words) {
  TablePair p;
  table_pair(p);
  auto other = p.b.connect(p.listener.address());  // another endpoint of the same listener
  ASSERT_TRUE(other.ok()) << other.status().to_string();
  auto other_server = p.listener.accept(kEventually);
  ASSERT_TRUE(other_server.ok());
  WriteRun w;
  prepare(p, w, std::vector<uint64_t>(300, 1000), 2, MemSpec{MemKind::kSim, 0});
  p.hooks->lie = static_cast<int>(lie);
  Request req = start_write(p, w);
  Status st = wait_for_failure(p.server, kEventually);
  EXPECT_EQ(st.code(), Code::kProtocol) << st.to_string();
  EXPECT_NE(st.message().find(words), std::string::npos) << st.to_string();
  EXPECT_FALSE(st.peer().empty()) << st.to_string();
  Status ws = req.wait(kEventually);
  EXPECT_FALSE(ws.ok());
  EXPECT_NE(ws.code(), Code::kTimeout) << ws.to_string();
  EXPECT_FALSE(p.server.next_notification(200ms).ok()) << "a refused write notified";
  // The other endpoint goes on.
  p.client = std::move(*other);
  p.server = std::move(*other_server);
  WriteRun next;
  prepare(p, next, std::vector<uint64_t>(300, 1000), 2, MemSpec{MemKind::kSim, 0});
  Request again = start_write(p, next);
  expect_write_lands(p, next, again);
}

TEST(TableHostile, DescriptorWithAPieceLess) {
  expect_lie_closes(MemcpyLie::kDropPiece, "the descriptor names 127 pieces, the table 128");
}
TEST(TableHostile, DescriptorWithALongerPiece) {
  expect_lie_closes(MemcpyLie::kLength, "piece 0 is 1001 B, the table says 1000 B");
}
TEST(TableHostile, DescriptorCountFieldLies) { expect_lie_closes(MemcpyLie::kCountField, "of 129 pieces"); }
TEST(TableHostile, DescriptorWithAStrayByte) { expect_lie_closes(MemcpyLie::kTrailing, "descriptor of 128 pieces"); }

}  // namespace
}  // namespace dmx::test
