// The rdma path's lists (transport/rdma/rdma_path.h "lists"): a KV cache's scattered blocks as one
// chunk, gathered by the sender's WRITEs into a staging window the receiver scatters. Byte-exact
// lists of up to 1,024 pieces, span and per-piece registration, the cuts a path must make, device
// destinations, dropped lists; hostile: descriptors that disagree with the table, a list written
// outside its window, the staging a peer can make us hold (admitted in order). Over a real verbs
// device (soft-RoCE in scripts/rxe-vm.sh's guest); skips with the reason elsewhere.
#include <gtest/gtest.h>

#include "test_env.h"

#if DMX_HAVE_RDMA
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "memory/sim_device.h"
#include "rdma_test_util.h"
#include "transport/rdma/rdma_path.h"

namespace dmx::rdma {
namespace {

using namespace std::chrono_literals;

// A list of scattered pieces (a KV cache's blocks) as one chunk: `n` pieces of odd sizes from
// src (a gap of 3 after each) into dst (a gap of 5 before each), or into memory at `dst_base`.
struct ListCase {
  std::vector<unsigned char> src;
  std::vector<MemRegion> srcs, dsts;
  std::vector<unsigned char> dst;  // host destinations, poisoned between the pieces
  uint64_t total = 0;
};
ListCase make_list(size_t n, size_t base, unsigned char* dst_base = nullptr) {
  ListCase c;
  std::vector<size_t> sizes;
  size_t src_len = 0, dst_len = 0;
  for (size_t i = 0; i < n; ++i) {
    size_t len = i == 7 ? 0 : base + (i * 37) % 613;  // one empty piece among them
    sizes.push_back(len);
    src_len += len + 3;
    dst_len += len + 5;
  }
  c.src = fresh(src_len);
  c.dst.assign(dst_len + 5, kPoison);
  size_t s = 0, d = 5;
  for (size_t len : sizes) {
    c.srcs.push_back(MemRegion{c.src.data() + s, len, {}});
    c.dsts.push_back(MemRegion{(dst_base ? dst_base : c.dst.data()) + d, len, {}});
    s += len + 3;
    d += len + 5;
    c.total += len;
  }
  return c;
}
bool list_landed(const ListCase& c) {
  for (size_t i = 0; i < c.srcs.size(); ++i) {
    const auto* d = static_cast<const unsigned char*>(c.dsts[i].ptr);
    if (!std::equal(d, d + c.dsts[i].size, static_cast<const unsigned char*>(c.srcs[i].ptr)) || d[-1] != kPoison)
      return false;
  }
  return c.dst.back() == kPoison;
}

// Three lists of 300 pieces (over a MiB each: stripes on every queue pair, each stripe gathered by
// several WRITEs of send_sge pieces) and one of 1,024 (the most): byte-exact, poison between, one
// chunk and one event each, scattered by memcpy; unregistered sources registered as one span a list.
TEST_F(RdmaPathTest, ListsLandByteExactAsOneChunk) {
  connect();
  EXPECT_EQ(a_.path->max_list(), kRdmaMaxList);
  std::vector<ListCase> lists;
  for (size_t n : {size_t{300}, size_t{300}, size_t{300}, kRdmaMaxList}) lists.push_back(make_list(n, 3500));
  uint64_t pieces = 0;
  for (size_t i = 0; i < lists.size(); ++i) {
    size_t taken = 0;
    auto d = a_.path->post_tx_list(i, lists[i].srcs, &taken);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    ASSERT_EQ(taken, lists[i].srcs.size());
    auto len = b_.path->chunk_length(*d);
    ASSERT_TRUE(len.ok());
    EXPECT_EQ(*len, lists[i].total);
    ASSERT_TRUE(b_.path->post_rx_list(i, *d, lists[i].dsts).ok());
    pieces += taken;
  }
  ASSERT_TRUE(b_.events.wait([&](Recorder& r) { return r.rx.size() == lists.size(); }));
  ASSERT_TRUE(a_.events.wait([&](Recorder& r) { return r.tx.size() == lists.size(); }));
  for (size_t i = 0; i < lists.size(); ++i) {
    EXPECT_TRUE(b_.events.rx[i].ok() && a_.events.tx[i].ok()) << b_.events.rx[i].to_string();
    EXPECT_TRUE(list_landed(lists[i])) << "list " << i;
  }
  // Unregistered sources: one registration of each list's span, not one a piece.
  EXPECT_NE(a_.path->describe().find("4 chunks registered alone"), std::string::npos) << a_.path->describe();
  PathStats st = b_.path->stats();
  EXPECT_EQ(st.chunks_received, lists.size());
  EXPECT_EQ(st.host_copies, pieces - lists.size());  // one memcpy a piece but the empty one, out of staging
  EXPECT_FALSE(a_.events.failure.has_value() || b_.events.failure.has_value());
}

// A list whose sources' span has a hole (an unmapped page between two pieces) cannot be
// registered as one: each piece is registered alone, and the list lands as well.
TEST_F(RdmaPathTest, ListSourcesAroundAHoleAreRegisteredPieceByPiece) {
  connect();
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* m = ::mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* base = static_cast<unsigned char*>(m);
  ASSERT_EQ(::munmap(base + page, page), 0);
  auto bytes = fresh(2 * page);
  std::memcpy(base, bytes.data(), page);
  std::memcpy(base + 2 * page, bytes.data() + page, page);
  std::vector<unsigned char> dst(2 * page + 10, kPoison);
  std::vector<MemRegion> srcs{{base + 1, page - 1, {}}, {base + 2 * page, page - 3, {}}};
  std::vector<MemRegion> dsts{{dst.data() + 5, page - 1, {}}, {dst.data() + 5 + page, page - 3, {}}};
  size_t taken = 0;
  auto d = a_.path->post_tx_list(1, srcs, &taken);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(taken, 2u);
  ASSERT_TRUE(b_.path->post_rx_list(1, *d, dsts).ok());
  ASSERT_TRUE(b_.events.wait([](Recorder& r) { return r.rx.count(1) > 0; }));
  ASSERT_TRUE(a_.events.wait([](Recorder& r) { return r.tx.count(1) > 0; }));
  EXPECT_TRUE(b_.events.rx[1].ok()) << b_.events.rx[1].to_string();
  EXPECT_TRUE(std::equal(base + 1, base + page, dst.begin() + 5));
  EXPECT_TRUE(std::equal(base + 2 * page, base + 3 * page - 3, dst.begin() + 5 + static_cast<ptrdiff_t>(page)));
  EXPECT_EQ(dst[4], kPoison);
  EXPECT_NE(a_.path->describe().find("2 chunks registered alone"), std::string::npos) << a_.path->describe();
  ::munmap(base, page);
  ::munmap(base + 2 * page, page);
}

// A path takes a prefix of a list where it must, and the rest goes in the next list chunk: at the
// chunk maximum (1 MiB here), at a change of memory kind, and at a piece it cannot register (an
// unmapped page: the pieces before it go, then that piece alone is refused with the reason).
TEST_F(RdmaPathTest, ListsAreCutWhereThePathMust) {
  Options o;
  o.a.max_chunk = o.b.max_chunk = 1 << 20;
  connect(o);
  uint64_t seq = 0;
  auto send_all = [&](std::vector<MemRegion> srcs, std::vector<MemRegion> dsts, std::vector<size_t>* cuts) {
    size_t at = 0;
    while (at < srcs.size()) {
      size_t taken = 0;
      auto d = a_.path->post_tx_list(++seq, std::span(srcs).subspan(at), &taken);
      ASSERT_TRUE(d.ok()) << d.status().to_string();
      ASSERT_GE(taken, 1u);
      ASSERT_TRUE(b_.path->post_rx_list(seq, *d, std::span(dsts).subspan(at, taken)).ok());
      cuts->push_back(taken);
      at += taken;
    }
    ASSERT_TRUE(b_.events.wait([&](Recorder& r) { return r.rx.size() == seq; }));
  };
  ListCase c = make_list(400, 3500);  // about 1.5 MiB
  std::vector<size_t> cuts;
  send_all(c.srcs, c.dsts, &cuts);
  ASSERT_GE(cuts.size(), 2u) << "a list over the chunk maximum went whole";
  for (size_t i = 0, at = 0; i < cuts.size(); at += cuts[i++]) {
    uint64_t bytes = 0;
    for (size_t k = at; k < at + cuts[i]; ++k) bytes += c.srcs[k].size;
    EXPECT_LE(bytes, uint64_t{1} << 20) << "cut " << i;
  }
  EXPECT_TRUE(list_landed(c));

  ListCase k = make_list(10, 5000);
  for (size_t i = 4; i < 10; ++i) k.srcs[i].where = MemSpec{MemKind::kPinned, 0};  // host memory by another name
  cuts.clear();
  send_all(k.srcs, k.dsts, &cuts);
  EXPECT_EQ(cuts, (std::vector<size_t>{4, 6}));
  EXPECT_TRUE(list_landed(k));
  for (auto& [i, st] : b_.events.rx) EXPECT_TRUE(st.ok()) << i << ": " << st.to_string();

  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* m = ::mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* base = static_cast<unsigned char*>(m);
  std::memset(base, 0x5C, page);
  ASSERT_EQ(::munmap(base + page, page), 0);
  std::vector<MemRegion> srcs{{base, 100, {}}, {base + page, 100, {}}, {base + 2 * page, 100, {}}};
  size_t taken = 0;
  auto d = a_.path->post_tx_list(++seq, srcs, &taken);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(taken, 1u) << "the piece in the hole must end the list";
  auto len = b_.path->chunk_length(*d);
  ASSERT_TRUE(len.ok());
  EXPECT_EQ(*len, 100u);
  std::vector<unsigned char> dst(100, kPoison);
  ASSERT_TRUE(b_.path->post_rx_list(seq, *d, std::vector<MemRegion>{{dst.data(), 100, {}}}).ok());
  auto bad = a_.path->post_tx_list(seq + 1, std::span(srcs).subspan(1), &taken);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().to_string().find("side b"), std::string::npos) << bad.status().to_string();
  ASSERT_TRUE(b_.events.wait([&](Recorder& r) { return r.rx.count(seq) > 0; }));
  EXPECT_TRUE(b_.events.rx[seq].ok()) << b_.events.rx[seq].to_string();
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](unsigned char x) { return x == 0x5C; }));
  EXPECT_FALSE(a_.events.failure.has_value() || b_.events.failure.has_value());
  ::munmap(base, page);
  ::munmap(base + 2 * page, page);
}

// A list into memory the NIC cannot register (simulated device memory) lands in the staging window
// and goes out as one list on the device's copy queue, or — a queue that takes no lists — one copy
// a piece on it, waited for once; a list the receiver drops (all destinations null) lets the
// sender go.
void list_into_device(RdmaPathTest& f, bool queue_takes_lists) {
  f.connect();
  struct Refuse {  // process-wide: back to the default however the test ends
    explicit Refuse(bool on) { sim_refuse_lists(on); }
    ~Refuse() { sim_refuse_lists(false); }
  } refuse(!queue_takes_lists);
  auto dev = Buffer::allocate(MemSpec{MemKind::kSim, 0}, 2 << 20);
  ASSERT_TRUE(dev.ok()) << dev.status().to_string();
  std::vector<unsigned char> poison(dev->size(), kPoison);
  ASSERT_TRUE(copy_memory(dev->region(), MemRegion{poison.data(), poison.size(), {}}).ok());
  ListCase c = make_list(100, 9000, static_cast<unsigned char*>(dev->data()));
  for (auto& d : c.dsts) d.where = dev->where();
  size_t taken = 0;
  auto d = f.a_.path->post_tx_list(1, c.srcs, &taken);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  ASSERT_TRUE(f.b_.path->post_rx_list(1, *d, c.dsts).ok());
  auto d2 = f.a_.path->post_tx_list(2, c.srcs, &taken);
  ASSERT_TRUE(d2.ok());
  std::vector<MemRegion> dropped(c.dsts.size());
  for (size_t i = 0; i < dropped.size(); ++i) dropped[i].size = c.dsts[i].size;
  ASSERT_TRUE(f.b_.path->post_rx_list(2, *d2, dropped).ok());
  ASSERT_TRUE(f.b_.events.wait([](Recorder& r) { return r.rx.size() == 2; }));
  ASSERT_TRUE(f.a_.events.wait([](Recorder& r) { return r.tx.size() == 2; }));
  EXPECT_TRUE(f.b_.events.rx[1].ok() && f.b_.events.rx[2].ok() && f.a_.events.tx[2].ok())
      << f.b_.events.rx[1].to_string();
  std::vector<unsigned char> back(dev->size());
  ASSERT_TRUE(copy_memory(MemRegion{back.data(), back.size(), {}}, dev->region()).ok());
  for (size_t i = 0; i < c.dsts.size(); ++i) {
    size_t at =
        static_cast<size_t>(static_cast<unsigned char*>(c.dsts[i].ptr) - static_cast<unsigned char*>(dev->data()));
    ASSERT_TRUE(std::equal(back.begin() + at, back.begin() + at + c.dsts[i].size,
                           static_cast<const unsigned char*>(c.srcs[i].ptr)))
        << "piece " << i;
    ASSERT_EQ(back[at - 1], kPoison) << "before piece " << i;  // untouched between the pieces
  }
  EXPECT_EQ(f.b_.path->stats().device_copies, 99u);  // one a piece but the empty one
}

TEST_F(RdmaPathTest, ListsIntoDeviceMemoryAndDroppedLists) {
  list_into_device(*this, true);
}
TEST_F(RdmaPathTest, ListsIntoDeviceMemoryByACopyEachWhenTheQueueTakesNoLists) {
  list_into_device(*this, false);
}

// Posts lists of `sizes` bytes (two pieces each) with the sender's WRITEs held, checks that the
// receiver opens `held` staging windows and no more, then releases the WRITEs: every list lands.
void stage_held_lists(RdmaPathTest& t, const std::vector<size_t>& sizes, size_t held) {
  t.connect_holding();
  std::vector<std::vector<unsigned char>> src, dst;
  for (size_t n : sizes) src.push_back(fresh(n)), dst.emplace_back(n + 64, kPoison);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const size_t half = sizes[i] / 2;
    std::vector<MemRegion> srcs{{src[i].data(), half, {}}, {src[i].data() + half, half, {}}};
    std::vector<MemRegion> dsts{{dst[i].data() + 64, half, {}}, {dst[i].data() + 64 + half, half, {}}};
    size_t taken = 0;
    auto d = t.a_.path->post_tx_list(i, srcs, &taken);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    ASSERT_EQ(taken, 2u);
    ASSERT_TRUE(t.b_.path->post_rx_list(i, *d, dsts).ok());
  }
  auto windows = [](size_t n) { return std::to_string(n) + " chunks registered alone"; };
  auto until = std::chrono::steady_clock::now() + test::kEventually;
  while (t.b_.path->describe().find(windows(held)) == std::string::npos && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(200ms);  // time for more, were more let through
  EXPECT_NE(t.b_.path->describe().find(windows(held)), std::string::npos) << t.b_.path->describe();
  t.hold_ = false;
  ASSERT_TRUE(t.b_.events.wait([&](Recorder& r) { return r.rx.size() == sizes.size(); }, 120s));
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_TRUE(t.b_.events.rx[i].ok()) << t.b_.events.rx[i].to_string();
    EXPECT_TRUE(std::equal(src[i].begin(), src[i].end(), dst[i].begin() + 64)) << "list " << i;
    EXPECT_EQ(dst[i][63], kPoison);
  }
  EXPECT_NE(t.b_.path->describe().find(windows(sizes.size())), std::string::npos) << t.b_.path->describe();
}

constexpr size_t kMiB = 1 << 20;

// A peer decides how many lists we stage at once: the receiver holds at most 64 MiB of staging
// (kMaxStaged) and answers the rest when room comes back. Ten lists of 8 MiB, the sender's
// WRITEs held: eight clear-to-sends (eight windows), then, released, every list lands.
TEST_F(RdmaPathTest, StagingForListsInFlightIsBounded) {
  stage_held_lists(*this, std::vector<size_t>(10, 8 * kMiB), 8);
}

// Staging is admitted in order: a list that does not fit waits, and a later one that would fit
// waits behind it (else small lists could keep a large one waiting for ever). Seven lists of
// 8 MiB and one of 4 MiB fill 60 of the 64 MiB, the sender's WRITEs held; then one of 8 MiB (no
// room) and one of 4 MiB (room): eight windows, not nine. Released, all ten land.
TEST_F(RdmaPathTest, StagingIsAdmittedInOrder) {
  std::vector<size_t> sizes(7, 8 * kMiB);
  sizes.insert(sizes.end(), {4 * kMiB, 8 * kMiB, 4 * kMiB});
  stage_held_lists(*this, sizes, 8);
}

// What a list's descriptor claims is checked against the receiver's own table: a length that is
// not the pieces' sum, a list "by SEND", too many pieces — each refused naming the peer, and the
// path goes on.
TEST_F(RdmaPathTest, ListDescriptorsThatDisagreeAreRefused) {
  connect();
  std::vector<unsigned char> dst(8192, kPoison);
  std::vector<MemRegion> dsts{{dst.data(), 1000, {}}, {dst.data() + 2000, 3000, {}}};
  auto refused = [&](ChunkDescriptor d, std::span<const MemRegion> list, const char* what) {
    Status s = b_.path->post_rx_list(1, d.encode(), list);
    EXPECT_EQ(s.code(), Code::kProtocol) << what << ": " << s.to_string();
    EXPECT_NE(s.to_string().find("side a"), std::string::npos) << s.to_string();
  };
  refused(ChunkDescriptor{3999, 5, false}, dsts, "one byte short");
  refused(ChunkDescriptor{4001, 5, false}, dsts, "one byte over");
  refused(ChunkDescriptor{1000, 5, false}, dsts, "less than the pieces");
  std::vector<MemRegion> small{{dst.data(), 1000, {}}, {dst.data() + 2000, 1000, {}}};
  refused(ChunkDescriptor{2000, 5, true}, small, "by SEND");  // a small chunk's length, and the pieces' sum
  std::vector<MemRegion> many(kRdmaMaxList + 1, MemRegion{dst.data(), 1, {}});
  refused(ChunkDescriptor{kRdmaMaxList + 1, 5, false}, many, "too many pieces");
  refused(ChunkDescriptor{0, 5, false}, {}, "no pieces");
  EXPECT_FALSE(b_.events.failure.has_value());
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](unsigned char c) { return c == kPoison; }));
}

// A sender that writes a list outside the window it was given is refused by the NIC, and not a
// byte of the list reaches its destinations: they are scattered only once every stripe landed.
TEST_F(RdmaPathTest, ListWrittenOutsideItsWindowLandsNothing) {
  tamper_.addr_delta = 1;
  Options o;
  o.a_tamper = &tamper_;
  connect(o);
  ListCase c = make_list(200, 2000);
  size_t taken = 0;
  auto d = a_.path->post_tx_list(1, c.srcs, &taken);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(b_.path->post_rx_list(1, *d, c.dsts).ok());
  expect_refused(a_, b_, c.dst);
}

}  // namespace
}  // namespace dmx::rdma

#else

TEST(RdmaListTest, NotBuilt) {
  DMX_SKIP(dmx::test::kNotBuilt) << "dmx was built without libibverbs (DMX_ENABLE_RDMA)";
}

#endif
