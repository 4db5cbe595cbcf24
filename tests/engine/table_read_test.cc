// Table chunks for vectored reads (docs/wire.md "Tables"): the target serves a read's run of small
// segments as one READ_DATA table chunk on a path that takes lists. Over the memcpy test path
// (memcpy_path.h) between two contexts: lists of every length, byte-exact. From a hostile target
// (a raw peer that agreed the memcpy path): a table that names a key, spans the reader's segments,
// runs past the read or past what is left, names another read or another length, or answers a
// plain read, or comes in a checksummed session — each lie told in both forms, by the path and
// inline (version 12: the pieces' bytes follow the table on the stream). The reader closes that
// peer with a message naming it; no byte lands; the listener goes on serving.
#include <gtest/gtest.h>

#include <random>

#include <sys/mman.h>
#include <sys/socket.h>

#include "engine/table_util.h"
#include "hostile/hostile_util.h"

namespace dmx::test {
namespace {

using wire::FrameHeader;
using wire::FrameType;

const MemSpec kSim{MemKind::kSim, 0};

// A walk in order with a hint finds what the search finds, whatever the hint says; a slice past a
// segment's end is refused with one.
TEST(VecLayoutFind, HintsNeverChangeTheAnswer) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<char> bytes(500 * 300);
  VecLayout l;
  for (int k = 0; k < 500; ++k) {
    uint64_t len = 1 + rng() % 300;
    l.segs.push_back(VecSeg{l.total, bytes.data() + l.total, len, 0, 0});
    l.total += len;
  }
  size_t hint = 0;
  for (uint64_t at = 0; at < l.total; ++at) {
    size_t want = l.find(at, 0);
    ASSERT_TRUE(l.segs[want].at <= at && at < l.segs[want].at + l.segs[want].length) << at;
    EXPECT_EQ(l.find(at, hint), want) << at << " from the last";
    EXPECT_EQ(l.find(at, rng() % (l.segs.size() + 3)), want) << at << " from anywhere";
    MemRegion one = l.slice(at, 1, &hint);
    EXPECT_EQ(hint, want);
    EXPECT_NE(one.ptr, nullptr);
    EXPECT_EQ(l.slice(at, l.segs[want].at + l.segs[want].length - at + 1, &hint).ptr, nullptr) << "spans two";
  }
}

// A read of `sizes` from `regions` sim regions of the target (filled with random bytes) into one
// poisoned sim buffer: the layout's local side is the reader's.
struct ReadRun {
  Layout layout;
  std::vector<Filled> sources;
  std::vector<Registration> regs;
  std::vector<RemoteRegion> remote;
  Buffer dst;
};

void prepare_read(TablePair& p, ReadRun& r, const std::vector<uint64_t>& sizes, uint32_t regions) {
  std::mt19937_64 rng(std::random_device{}());
  r.layout = make_layout(sizes, regions, rng);
  for (uint32_t k = 0; k < regions; ++k) {
    r.sources.push_back(filled(kSim, r.layout.region_size[k]));
    auto reg = p.a.register_memory(r.sources.back().buf.region());
    ASSERT_TRUE(reg.ok()) << reg.status().to_string();
    r.remote.push_back(reg->remote());
    r.regs.push_back(std::move(*reg));
  }
  r.dst = poisoned(kSim, r.layout.local_size);
}

void expect_read_lands(TablePair& p, ReadRun& r) {
  MemRegion local[] = {r.dst.region()};
  Request req = p.client.read_vec(local, r.remote, r.layout.entries);
  Status st = req.wait(kEventually);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(req.bytes(), r.layout.total);
  expect_read_landed(r.layout, r.sources, read_back(r.dst.region()));
}

// Lists of 0 to 100,000 small segments (1-300 B) from two regions: 128 a list (the memcpy path's
// most), a last one alone a chunk; every byte checked.
TEST(TableReads, ListsOfEveryLengthLandByteExact) {
  TablePair p;
  table_pair(p);
  std::mt19937_64 rng(std::random_device{}());
  for (size_t n : {size_t(0), size_t(1), size_t(2), size_t(128), size_t(129), size_t(1000), size_t(100000)}) {
    SCOPED_TRACE(n);
    uint64_t lists0 = p.hooks->lists_received, pieces0 = p.hooks->pieces_received, chunks0 = p.hooks->chunks_sent;
    std::vector<uint64_t> sizes(n);
    for (uint64_t& s : sizes) s = 1 + rng() % 300;
    ReadRun r;
    ASSERT_NO_FATAL_FAILURE(prepare_read(p, r, sizes, 2));
    ASSERT_NO_FATAL_FAILURE(expect_read_lands(p, r));
    EXPECT_EQ(p.hooks->lists_received - lists0, n / 128 + (n % 128 >= 2 ? 1 : 0));
    EXPECT_EQ(p.hooks->pieces_received - pieces0, n - (n % 128 == 1 ? 1 : 0));
    EXPECT_EQ(p.hooks->chunks_sent - chunks0, n % 128 == 1 ? 1u : 0u);
  }
  EXPECT_TRUE(p.client.health().ok() && p.server.health().ok());
}

// Odd sizes with segments over 1 MiB among them (those go chunk by chunk between the lists), and a
// read whose target turns its lists down (they go one by one).
TEST(TableReads, BigSegmentsBetweenListsAndAPathThatTurnsListsDown) {
  TablePair p;
  table_pair(p);
  const std::vector<uint64_t> sizes = {65537, 1, 4095, (1 << 20) + 1, 70000, 4097, 1 << 20, 3, 100000, 2, 12345};
  ReadRun r;
  ASSERT_NO_FATAL_FAILURE(prepare_read(p, r, sizes, 3));
  ASSERT_NO_FATAL_FAILURE(expect_read_lands(p, r));
  EXPECT_GT(p.hooks->lists_received, 0u);
  p.hooks->refuse_lists = true;
  uint64_t lists0 = p.hooks->lists_received;
  ReadRun again;
  ASSERT_NO_FATAL_FAILURE(prepare_read(p, again, sizes, 2));
  ASSERT_NO_FATAL_FAILURE(expect_read_lands(p, again));
  EXPECT_EQ(p.hooks->lists_received, lists0);
}

// ---- a hostile target ------------------------------------------------------------------------


// The reader: an endpoint of a listener that agreed the memcpy path with a raw peer (the target).
// Its read: three segments of 100, 50 and 30 bytes (the read's offsets 0, 100, 150; 180 in all)
// from the peer's key 0x77 into a poisoned buffer, or a plain read of 180 bytes when !vectored.
struct Reader {
  std::shared_ptr<MemcpyHooks> hooks = std::make_shared<MemcpyHooks>();
  Server s;
  std::optional<RawPeer> peer;
  Endpoint ep;
  Buffer dst = poisoned(MemSpec{}, 1000);
  Filled src = filled(MemSpec{}, 4096);  // the raw peer's memory its descriptors name
  Request req;
  uint64_t id = 0;
  uint8_t path = 0;
  bool inline_form = false;  // the raw target answers inline (version 12) rather than by the path
};

void connect_reader(Reader& r, const Options& o = table_options()) {
  r.s = make_server(o);
  r.s.ctx.impl()->register_transport(make_memcpy_transport(r.hooks, kTableTransport));
  auto peer = RawPeer::connect(r.s.listener.address(), kHostileKey, 1, false,
                               {wire::Offer{"tcp", {1}}, wire::Offer{kTableTransport, {1}}});
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  r.peer = std::move(*peer);
  r.path = r.peer->path_id(kTableTransport);
  ASSERT_NE(r.path, 0) << "the server did not agree the memcpy path";
  auto ep = r.s.listener.accept(10s);
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  r.ep = std::move(*ep);
}

void start_read(Reader& r, bool vectored = true, const Options& o = table_options()) {
  ASSERT_NO_FATAL_FAILURE(connect_reader(r, o));
  RemoteRegion remote{0x77, 4096};
  if (vectored) {
    MemRegion local[] = {r.dst.region()};
    RemoteRegion remotes[] = {remote};
    std::vector<IoEntry> entries = {{0, 0, 10, 0, 100}, {0, 0, 200, 500, 50}, {0, 0, 300, 1000, 30}};
    r.req = r.ep.read_vec(local, remotes, entries);
  } else {
    r.req = r.ep.read(r.dst.region().sub(10, 180), remote, 0);
  }
  for (;;) {  // the READ_REQs: the last one has no MORE
    auto f = r.peer->read(0);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    if (f->header.type != FrameType::kReadReq) continue;
    r.id = f->header.id;
    if ((f->header.flags & wire::kFlagMore) == 0) break;
  }
}

MemRegion src_at(Reader& r, uint64_t offset, uint64_t len) { return r.src.buf.region().sub(offset, len); }

// An inline READ_DATA table: `pieces`, then `bytes` (normally the pieces' bytes).
std::pair<FrameHeader, std::vector<unsigned char>> inline_read_table(uint64_t id, uint64_t offset, uint64_t total,
                                                                     const std::vector<Piece>& pieces,
                                                                     const std::vector<unsigned char>& bytes) {
  FrameHeader h;
  h.type = FrameType::kReadData;
  h.flags = wire::kFlagTable;
  h.id = id;
  h.a0 = offset;
  h.a1 = total;
  h.a2 = pieces.size();
  std::vector<unsigned char> payload = table_entries(pieces);
  payload.insert(payload.end(), bytes.begin(), bytes.end());
  h.payload_len = static_cast<uint32_t>(payload.size());
  return {h, payload};
}

// A READ_DATA table on `path`: `pieces`, then the memcpy path's descriptor of `srcs`.
std::pair<FrameHeader, std::vector<unsigned char>> read_table(uint8_t path, uint64_t id, uint64_t offset,
                                                              uint64_t total, const std::vector<Piece>& pieces,
                                                              const std::vector<MemRegion>& srcs) {
  auto t = inline_read_table(id, offset, total, pieces, memcpy_path::encode(MemSpec{}, srcs));
  t.first.path = path;
  return t;
}

// The raw target's answer in the reader's form: the pieces' bytes are the peer's memory from
// byte 7 on, named by the path's descriptor or carried inline.
constexpr uint64_t kFrom = 7;
std::pair<FrameHeader, std::vector<unsigned char>> reply(Reader& r, uint64_t id, uint64_t offset, uint64_t total,
                                                         const std::vector<Piece>& pieces) {
  uint64_t sum = 0;
  std::vector<MemRegion> srcs;
  for (const Piece& p : pieces) {
    srcs.push_back(src_at(r, kFrom + sum, p.length));
    sum += p.length;
  }
  if (!r.inline_form) return read_table(r.path, id, offset, total, pieces, srcs);
  auto from = r.src.data.begin() + kFrom;
  return inline_read_table(id, offset, total, pieces, {from, from + static_cast<ptrdiff_t>(sum)});
}

void expect_closed(Reader& r, const std::vector<std::pair<FrameHeader, std::vector<unsigned char>>>& frames,
                   const std::string& words) {
  for (const auto& [h, payload] : frames) ASSERT_TRUE(r.peer->send(h, payload).ok());
  Status st = wait_for_failure(r.ep, kEventually);
  EXPECT_EQ(st.code(), Code::kProtocol) << st.to_string();
  EXPECT_NE(st.message().find(words), std::string::npos) << st.to_string();
  EXPECT_FALSE(st.peer().empty()) << "the error must name the peer: " << st.to_string();
  EXPECT_FALSE(r.req.wait(kEventually).ok());
  for (unsigned char c : read_back(r.dst.region())) ASSERT_EQ(c, 0xA5) << "a lying table touched the buffer";
  expect_serves_a_good_client(r.s);
}

// A segment of 4 GiB or more cannot be a table entry (32-bit lengths): the reader sends it in a
// READ_REQ of its own, between the tables of the segments around it, all in order. (The target's
// side of that mix: BadPeerVec.AReadMixingTablesAndPlainSegmentsIsServed.) The buffer is mapped,
// never touched: the raw target refuses the read.
TEST(TableReads, ASegmentOf4GiBGoesInAReadReqOfItsOwn) {
  constexpr uint64_t kBig = (uint64_t{1} << 32) + 5;
  const size_t size = kBig + 8192;
  void* mem = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  struct Unmap {
    void* p;
    size_t n;
    ~Unmap() { ::munmap(p, n); }
  } unmap{mem, size};
  Reader r;
  ASSERT_NO_FATAL_FAILURE(connect_reader(r));
  MemRegion local[] = {MemRegion{mem, size, {}}};
  RemoteRegion remotes[] = {RemoteRegion{0x77, uint64_t{16} << 30}};
  std::vector<IoEntry> entries = {{0, 0, 0, 7, 100}, {0, 0, 4096, 1000, kBig}, {0, 0, kBig + 4096 + 10, 20, 30}};
  r.req = r.ep.read_vec(local, remotes, entries);
  struct Want {
    uint8_t flags;
    uint64_t a0, a1, a2;
    std::vector<wire::TableEntry> table;
  };
  const uint8_t v = wire::kFlagVector, t = wire::kFlagTable, more = wire::kFlagMore;
  const Want want[] = {{static_cast<uint8_t>(v | t | more), 1, 0, 0, {{0x77, 7, 100}}},
                       {static_cast<uint8_t>(v | more), 0x77, 1000, kBig, {}},
                       {static_cast<uint8_t>(v | t), 1, 0, 0, {{0x77, 20, 30}}}};
  uint64_t id = 0;
  for (const Want& w : want) {
    Result<Frame> f = Status(Code::kInternal, "none");
    do f = r.peer->read(0);
    while (f.ok() && f->header.type != FrameType::kReadReq);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    const FrameHeader& h = f->header;
    if (id == 0) id = h.id;
    EXPECT_EQ(h.id, id);
    EXPECT_EQ(h.flags, w.flags);
    EXPECT_EQ(h.a0, w.a0);
    EXPECT_EQ(h.a1, w.a1);
    EXPECT_EQ(h.a2, w.a2);
    ASSERT_EQ(f->payload.size(), w.table.size() * wire::kTableEntrySize);
    for (size_t k = 0; k < w.table.size(); ++k) {
      wire::TableEntry e = wire::get_table_entry(f->payload.data() + k * wire::kTableEntrySize);
      EXPECT_EQ(e.key, w.table[k].key);
      EXPECT_EQ(e.offset, w.table[k].offset);
      EXPECT_EQ(e.length, w.table[k].length);
    }
  }
  FrameHeader ack;
  ack.type = FrameType::kAck;
  ack.id = id;
  ack.a0 = static_cast<uint64_t>(Code::kNotFound);
  ack.a1 = static_cast<uint64_t>(wire::OpKind::kRead);
  ASSERT_TRUE(r.peer->send(ack).ok());
  Status st = r.req.wait(kEventually);
  EXPECT_EQ(st.code(), Code::kNotFound) << st.to_string();
  EXPECT_TRUE(r.ep.health().ok()) << r.ep.health().to_string();
  ::shutdown(r.peer->fd(), SHUT_RDWR);  // the raw peer ends first: the endpoint's close waits for no CLOSE
}

// The same lies in both forms of a read table: by the path and inline (docs/wire.md "Read tables",
// "Inline read tables").
class ReadTableHostile : public ::testing::TestWithParam<bool> {
 protected:
  void start(Reader& r, bool vectored = true, const Options& o = table_options()) {
    r.inline_form = GetParam();
    start_read(r, vectored, o);
  }
};

TEST_P(ReadTableHostile, AGoodTableLands) {  // the seam itself works
  Reader r;
  ASSERT_NO_FATAL_FAILURE(start(r));
  auto f = reply(r, r.id, 0, 180, {{0, 0, 100}, {0, 100, 50}, {0, 150, 30}});
  ASSERT_TRUE(r.peer->send(f.first, f.second).ok());
  Status st = r.req.wait(kEventually);
  ASSERT_TRUE(st.ok()) << st.to_string();
  auto got = read_back(r.dst.region());
  auto from = r.src.data.begin() + kFrom;
  EXPECT_TRUE(std::equal(from, from + 100, got.begin() + 10));
  EXPECT_TRUE(std::equal(from + 100, from + 150, got.begin() + 200));
  EXPECT_TRUE(std::equal(from + 150, from + 180, got.begin() + 300));
  EXPECT_EQ(got[9], 0xA5);
  EXPECT_EQ(got[110], 0xA5);
  EXPECT_EQ(got[330], 0xA5);
  EXPECT_EQ(r.hooks->lists_received, r.inline_form ? 0u : 1u) << "the table did not come in this form";
  EXPECT_TRUE(r.ep.health().ok()) << r.ep.health().to_string();
  ::shutdown(r.peer->fd(), SHUT_RDWR);  // the raw peer ends first: the endpoint's close waits for no CLOSE
}

TEST_P(ReadTableHostile, PieceNamesAKey) {
  Reader r;
  ASSERT_NO_FATAL_FAILURE(start(r));
  expect_closed(r, {reply(r, r.id, 0, 180, {{0, 0, 100}, {5, 100, 50}})}, "names key 0x5");
}

TEST_P(ReadTableHostile, PieceSpansTheReadersSegments) {
  Reader r;
  ASSERT_NO_FATAL_FAILURE(start(r));
  expect_closed(r, {reply(r, r.id, 0, 180, {{0, 0, 120}})}, "spans segments");
}

TEST_P(ReadTableHostile, PiecePastTheRead) {
  Reader r;
  ASSERT_NO_FATAL_FAILURE(start(r));
  expect_closed(r, {reply(r, r.id, 0, 180, {{0, 170, 20}})}, "lies outside");
  Reader r2;
  ASSERT_NO_FATAL_FAILURE(start(r2));
  expect_closed(r2, {reply(r2, r2.id, 0, 180, {{0, UINT64_MAX - 5, 10}})}, "lies outside");
}

TEST_P(ReadTableHostile, PieceOfLengthZero) {
  Reader r;
  ASSERT_NO_FATAL_FAILURE(start(r));
  expect_closed(r, {reply(r, r.id, 0, 180, {{0, 0, 100}, {0, 100, 0}, {0, 150, 30}})}, "table piece 1 of 0 bytes");
}

TEST_P(ReadTableHostile, MoreThanTheReadHasLeft) {  // the same pieces twice
  Reader r;
  ASSERT_NO_FATAL_FAILURE(start(r));
  auto once = reply(r, r.id, 0, 180, {{0, 0, 100}, {0, 100, 50}});
  ASSERT_TRUE(r.peer->send(once.first, once.second).ok());  // this one may land: only the second lies
  ASSERT_TRUE(r.peer->send(once.first, once.second).ok());
  Status st = wait_for_failure(r.ep, kEventually);
  EXPECT_EQ(st.code(), Code::kProtocol) << st.to_string();
  EXPECT_NE(st.message().find("bytes left"), std::string::npos) << st.to_string();
  EXPECT_FALSE(r.req.wait(kEventually).ok());
  expect_serves_a_good_client(r.s);
}

TEST_P(ReadTableHostile, AnotherReadOrAnotherLength) {
  Reader r;
  ASSERT_NO_FATAL_FAILURE(start(r));
  expect_closed(r, {reply(r, r.id + 1, 0, 180, {{0, 0, 100}})}, "unknown id");
  Reader r2;
  ASSERT_NO_FATAL_FAILURE(start(r2));
  expect_closed(r2, {reply(r2, r2.id, 0, 181, {{0, 0, 100}})}, "181-byte read");
}

TEST_P(ReadTableHostile, TableForAPlainRead) {
  Reader r;
  ASSERT_NO_FATAL_FAILURE(start(r, /*vectored=*/false));
  expect_closed(r, {reply(r, r.id, 0, 180, {{0, 0, 100}})}, "not vectored");
}

// Tables never travel where the handshake agreed checksums (a chunk's CRC covers one run of bytes).
TEST_P(ReadTableHostile, TableInAChecksummedSession) {
  Options o = table_options();
  o.set("checksum", "crc32c");
  Reader r;
  ASSERT_NO_FATAL_FAILURE(start(r, true, o));
  expect_closed(r, {reply(r, r.id, 0, 180, {{0, 0, 100}, {0, 100, 50}})},
                "lacks a checksum, but the handshake agreed crc32c");
}

INSTANTIATE_TEST_SUITE_P(Forms, ReadTableHostile, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "inline" : "path"; });

// What only one form can say: a path's descriptor that disagrees with its table, and inline
// bytes that are not what the table sums to.
TEST(TableReadsHostile, DescriptorDisagreesWithTheTable) {
  Reader r;
  ASSERT_NO_FATAL_FAILURE(start_read(r));
  expect_closed(r, {read_table(r.path, r.id, 0, 180, {{0, 0, 100}, {0, 100, 50}}, {src_at(r, 0, 100), src_at(r, 0, 49)})},
                "READ_DATA");
}

TEST(InlineReadTableHostile, PiecesSumToOtherThanTheBytesThatFollow) {
  for (size_t bytes : {151, 149}) {
    Reader r;
    ASSERT_NO_FATAL_FAILURE(start_read(r));
    std::vector<unsigned char> some(r.src.data.begin(), r.src.data.begin() + static_cast<ptrdiff_t>(bytes));
    expect_closed(r, {inline_read_table(r.id, 0, 180, {{0, 0, 100}, {0, 100, 50}}, some)},
                  "an inline table's pieces sum to 150 bytes; " + std::to_string(bytes) + " follow it");
  }
}

}  // namespace
}  // namespace dmx::test
