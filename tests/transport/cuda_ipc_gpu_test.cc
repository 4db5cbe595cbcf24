// cuda_ipc on real GPUs: two processes, one owning device memory and exporting a region, the other
// reading and writing sub-ranges of it on the copy engines; invalidation; the owner killed with
// copies in flight. Skipped with the reason on machines without a usable GPU.
//
// CUDA cannot be used in a child forked after the parent initialised it, so the test process
// itself never calls CUDA: the probe and both peers run in forked children.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "memory/backend.h"
#include "transport/cuda_ipc/cuda_ipc.h"
#include "transport/gpu_children.h"
#include "transport/transport_test_util.h"

namespace dmx::cuda_ipc {
namespace {

using testing::check_pattern;
using testing::fill_pattern;
using testing::probe_gpus;
using testing::secs;

std::vector<std::byte> bytes_of(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size()};
}

Status host_to(const MemRegion& dst, const std::vector<uint8_t>& src) {
  return copy_memory(dst, {const_cast<uint8_t*>(src.data()), src.size(), {}});
}

// Progress until every op in [first, last] completed, each exactly once (else 2); counts failures.
int finish_all(CopyEngine& e, uint64_t first, uint64_t last, Deadline deadline, int* failures) {
  std::vector<CopyCompletion> out;
  size_t want = last - first + 1;
  std::vector<bool> seen(want, false);
  size_t got = 0;
  while (got < want) {
    out.clear();
    e.progress(&out);
    for (auto& c : out) {
      ++got;
      if (c.op < first || c.op > last || seen[c.op - first]) return 2;
      seen[c.op - first] = true;
      if (!c.status.ok()) {
        ++*failures;
        fprintf(stderr, "copy %llu: %s\n", (unsigned long long)c.op, c.status.to_string().c_str());
      }
    }
    if (got < want && !e.wait(deadline).ok()) return 1;
  }
  return 0;
}

constexpr size_t kRegion = (64 << 20) + 3;
constexpr size_t kRegionOffset = 4097;  // the exported region starts at an odd offset in its allocation

// The owner: allocates, fills the region with pattern 1, exports, then checks what the user wrote.
int owner(UnixChannel ch, int device) {
  auto buf = Buffer::allocate({MemKind::kCuda, device}, kRegion + kRegionOffset + 11);
  CHILD_CHECK(buf.ok(), 10);
  MemRegion region = buf->region().sub(kRegionOffset, kRegion);
  std::vector<uint8_t> host(kRegion);
  fill_pattern(host.data(), kRegion, 1);
  CHILD_CHECK(host_to(region, host).ok(), 11);
  Exporter ex;
  auto d = ex.export_region(region);
  CHILD_CHECK(d.ok(), 12);
  auto again = ex.export_region(region.sub(5, 10));  // same allocation: same id, other range
  CHILD_CHECK(again.ok() && again->alloc_id == d->alloc_id && again->offset == d->offset + 5, 13);
  CHILD_CHECK(ch.send(d->encode(), {}, secs(10)).ok(), 14);
  std::vector<std::byte> msg;
  CHILD_CHECK(ch.recv(&msg, 0, nullptr, secs(120)).ok(), 15);  // "written"
  std::vector<uint8_t> back(kRegion);
  CHILD_CHECK(copy_memory({back.data(), kRegion, {}}, region).ok(), 16);
  // The user wrote pattern 2 at [1, +4097) and pattern 3 at [(1 << 20) + 5, +(1 << 20) + 1).
  CHILD_CHECK(check_pattern(back.data() + 1, 4097, 2) == SIZE_MAX, 17);
  CHILD_CHECK(check_pattern(back.data() + (1 << 20) + 5, (1 << 20) + 1, 3) == SIZE_MAX, 18);
  for (size_t i : {size_t(0), size_t(4098), size_t((1 << 20) + 4), size_t(2 << 20) + 6, kRegion - 1})
    CHILD_CHECK(back[i] == testing::pattern_byte(1, i), 19);
  auto id = ex.forget(region.ptr);
  CHILD_CHECK(id.ok() && *id == d->alloc_id, 20);
  CHILD_CHECK(ch.send(bytes_of(std::to_string(*id)), {}, secs(10)).ok(), 21);
  CHILD_CHECK(ch.recv(&msg, 0, nullptr, secs(60)).ok(), 22);  // the user closed its mapping
  return 0;
}

int user(UnixChannel ch, int device) {
  std::vector<std::byte> msg;
  CHILD_CHECK(ch.recv(&msg, 0, nullptr, secs(60)).ok(), 30);
  auto d = IpcDescriptor::decode(msg);
  CHILD_CHECK(d.ok() && d->length == kRegion, 31);
  auto engine = CopyEngine::create({.device = device});
  CHILD_CHECK(engine.ok(), 32);
  CopyEngine& e = **engine;
  fprintf(stderr, "user: %s\n", e.peer_access_report().c_str());
  std::string peer = ch.peer_name();
  auto local = Buffer::allocate({MemKind::kCuda, device}, kRegion + 7);
  CHILD_CHECK(local.ok(), 33);
  // Read all of it to an odd local offset, then 32 random sub-ranges at once, sizes 0 and 1 too.
  CHILD_CHECK(e.read(1, local->region().sub(7, kRegion), peer, *d, 0).ok(), 34);
  int failures = 0;
  CHILD_CHECK(finish_all(e, 1, 1, secs(60), &failures) == 0 && failures == 0, 35);
  std::vector<uint8_t> host(kRegion);
  CHILD_CHECK(copy_memory({host.data(), kRegion, {}}, local->region().sub(7, kRegion)).ok(), 36);
  CHILD_CHECK(check_pattern(host.data(), kRegion, 1) == SIZE_MAX, 37);

  std::mt19937_64 rng(5);
  struct Range { size_t remote, local, n; };
  std::vector<Range> ranges = {{3, 0, 0}, {kRegion - 1, 1, 1}};
  size_t at = 16;
  while (ranges.size() < 32) {
    size_t n = 1 + rng() % (1 << 20);
    ranges.push_back({rng() % (kRegion - n), at, n});
    at += n + 3;
  }
  auto scratch = Buffer::allocate({MemKind::kCuda, device}, at);
  CHILD_CHECK(scratch.ok(), 38);
  for (size_t i = 0; i < ranges.size(); ++i)
    CHILD_CHECK(e.read(100 + i, scratch->region().sub(ranges[i].local, ranges[i].n), peer, *d, ranges[i].remote).ok(), 39);
  CHILD_CHECK(e.pending() > 0 || true, 40);
  CHILD_CHECK(finish_all(e, 100, 100 + ranges.size() - 1, secs(60), &failures) == 0 && failures == 0, 41);
  std::vector<uint8_t> got(at);
  CHILD_CHECK(copy_memory({got.data(), at, {}}, scratch->region()).ok(), 42);
  for (auto& r : ranges)
    for (size_t k = 0; k < r.n; k += 997) CHILD_CHECK(got[r.local + k] == testing::pattern_byte(1, r.remote + k), 43);

  // Writes: from device memory and from pageable host memory, at odd remote offsets.
  std::vector<uint8_t> p2(4097), p3((1 << 20) + 1);
  fill_pattern(p2.data(), p2.size(), 2);
  fill_pattern(p3.data(), p3.size(), 3);
  CHILD_CHECK(host_to(local->region().sub(1, p2.size()), p2).ok(), 44);
  CHILD_CHECK(e.write(200, local->region().sub(1, p2.size()), peer, *d, 1).ok(), 45);
  CHILD_CHECK(e.write(201, {p3.data(), p3.size(), {}}, peer, *d, (1 << 20) + 5).ok(), 46);
  CHILD_CHECK(e.write(202, {p3.data(), 2, {}}, peer, *d, kRegion - 1).code() == Code::kOutOfRange, 47);
  CHILD_CHECK(finish_all(e, 200, 201, secs(60), &failures) == 0 && failures == 0, 48);
  CHILD_CHECK(ch.send(bytes_of("written"), {}, secs(10)).ok(), 49);
  // Invalidation from the owner closes our mapping.
  CHILD_CHECK(ch.recv(&msg, 0, nullptr, secs(60)).ok(), 50);
  uint64_t id = std::stoull(std::string(reinterpret_cast<const char*>(msg.data()), msg.size()));
  CHILD_CHECK(id == d->alloc_id, 51);
  uint64_t closes = e.cache_stats().closes;
  e.invalidate(peer, id);
  CHILD_CHECK(e.cache_stats().closes == closes + 1, 52);
  CHILD_CHECK(e.cache_stats().misses == 1 && e.cache_stats().hits >= 34, 53);
  CHILD_CHECK(ch.send(bytes_of("closed"), {}, secs(10)).ok(), 54);
  return 0;
}

void run_pair(const std::function<int(UnixChannel)>& a, const std::function<int(UnixChannel)>& b, int* ra, int* rb,
              pid_t* pa = nullptr) {
  auto p = UnixChannel::pair();
  ASSERT_TRUE(p.ok());
  pid_t ca = testing::fork_child([&] {
    { UnixChannel drop = std::move(p->second); }
    return a(std::move(p->first));
  });
  if (pa) *pa = ca;
  pid_t cb = testing::fork_child([&] {
    { UnixChannel drop = std::move(p->first); }
    return b(std::move(p->second));
  });
  { UnixChannel d1 = std::move(p->first), d2 = std::move(p->second); }
  *rb = testing::wait_child(cb, std::chrono::seconds(180));
  *ra = testing::wait_child(ca, std::chrono::seconds(30));
}

TEST(CudaIpcGpu, TwoProcessesReadWriteSubRangesAndInvalidate) {
  std::string why;
  int n = probe_gpus(&why);
  if (n < 1) DMX_SKIP(::dmx::test::kNoGpu) << why;
  int owner_dev = n >= 2 ? 1 : 0;  // one GPU: two processes share it (still cuda_ipc)
  int ro = -1, ru = -1;
  run_pair([&](UnixChannel c) { return owner(std::move(c), owner_dev); },
           [&](UnixChannel c) { return user(std::move(c), 0); }, &ro, &ru);
  EXPECT_EQ(ru, 0);
  EXPECT_EQ(ro, 0);
}

TEST(CudaIpcGpu, OwnerKilledWithCopiesInFlightNeverHangs) {
  std::string why;
  int n = probe_gpus(&why);
  if (n < 1) DMX_SKIP(::dmx::test::kNoGpu) << why;
  int owner_dev = n >= 2 ? 1 : 0;
  constexpr size_t kBig = 256 << 20;
  int ro = -1, ru = -1;
  pid_t owner_pid = -1;
  auto victim = [&](UnixChannel ch) {
    auto buf = Buffer::allocate({MemKind::kCuda, owner_dev}, kBig);
    CHILD_CHECK(buf.ok(), 60);
    Exporter ex;
    auto d = ex.export_region(buf->region());
    CHILD_CHECK(d.ok(), 61);
    CHILD_CHECK(ch.send(d->encode(), {}, secs(10)).ok(), 62);
    for (;;) ::pause();
  };
  auto survivor = [&](UnixChannel ch) {
    std::vector<std::byte> msg;
    CHILD_CHECK(ch.recv(&msg, 0, nullptr, secs(60)).ok(), 70);
    auto d = IpcDescriptor::decode(msg);
    CHILD_CHECK(d.ok(), 71);
    auto engine = CopyEngine::create({.device = 0});
    CHILD_CHECK(engine.ok(), 72);
    auto local = Buffer::allocate({MemKind::kCuda, 0}, kBig);
    CHILD_CHECK(local.ok(), 73);
    for (uint64_t i = 0; i < 16; ++i)
      CHILD_CHECK((*engine)->write(i, local->region().sub(i * (kBig / 16), kBig / 16), ch.peer_name(), *d,
                                   i * (kBig / 16)).ok(), 74);
    ::kill(d->owner_pid, SIGKILL);  // the owner dies with our copies in flight
    auto t0 = Clock::now();
    int failures = 0;
    CHILD_CHECK(finish_all(**engine, 0, 15, secs(10), &failures) == 0, 75);  // completes, ok or not
    CHILD_CHECK(Clock::now() - t0 < std::chrono::seconds(10), 76);
    // The owner's side channel closes once its exit gets to its files (after its GPU context is
    // torn down, which takes a while): wait for that, bounded.
    std::vector<std::byte> none;
    CHILD_CHECK(ch.recv(&none, 0, nullptr, secs(20)).code() == Code::kPeerFailed, 77);
    (*engine)->drop_peer(ch.peer_name());
    CHILD_CHECK((*engine)->cache_stats().closes == 1, 78);
    fprintf(stderr, "survivor: %d of 16 copies failed after the owner died\n", failures);
    return 0;
  };
  run_pair(victim, survivor, &ro, &ru, &owner_pid);
  EXPECT_EQ(ru, 0);
  EXPECT_EQ(ro, 128 + SIGKILL);
}

// An allocation that is freed and never exported again is found by Exporter::sweep and retired,
// for cudaMalloc memory and for both blocks of a cuMem range; a live one is not (and stays a cache
// hit); a sweep looks at each entry at most once, round robin over calls.
TEST(CudaIpcGpu, SweepRetiresFreedAllocations) {
  std::string why;
  int n = probe_gpus(&why);
  if (n < 1) DMX_SKIP(::dmx::test::kNoGpu) << why;
  pid_t c = testing::fork_child([&] {
    Exporter ex;
    auto keep = Buffer::allocate({MemKind::kCuda, 0}, 1 << 20);
    auto gone = Buffer::allocate({MemKind::kCuda, 0}, 3 << 20);
    auto range = Buffer::allocate_cumem(0, 4 << 20, 2 << 20);
    CHILD_CHECK(keep.ok() && gone.ok() && range.ok(), 10);
    auto k = ex.export_region(keep->region());
    auto g = ex.export_region(gone->region().sub(5, 100));
    auto r1 = ex.export_region(range->region().sub(0, 100));
    auto r2 = ex.export_region(range->region().sub(3 << 20, 100));
    CHILD_CHECK(k.ok() && g.ok() && r1.ok() && r2.ok(), 11);
    CHILD_CHECK(r1->kind == IpcDescriptor::Kind::kCuMemFd && r1->alloc_id != r2->alloc_id, 12);
    CHILD_CHECK(ex.exported() == 4 && ex.sweep(64) == 0 && ex.retired() == 0, 13);
    *gone = Buffer();  // freed, as a user would, without telling the exporter
    *range = Buffer();
    size_t found = ex.sweep(2) + ex.sweep(2);  // two calls of two look at all four
    CHILD_CHECK(found == 3, 14);
    std::vector<uint64_t> ids = ex.take_retired(16), want = {g->alloc_id, r1->alloc_id, r2->alloc_id};
    std::sort(ids.begin(), ids.end());
    std::sort(want.begin(), want.end());
    CHILD_CHECK(ids == want, 15);
    CHILD_CHECK(ex.exported() == 1 && ex.sweep(64) == 0, 16);
    auto again = ex.export_region(keep->region());
    CHILD_CHECK(again.ok() && again->alloc_id == k->alloc_id, 17);
    return 0;
  });
  EXPECT_EQ(testing::wait_child(c, std::chrono::seconds(60)), 0);
}

// Exports go through the GTLB: sub-ranges of one allocation cost a lookup and the buffer-id check,
// not a new handle; memory freed and allocated again at the same address is never translated to
// the old export (its buffer id differs), and a forgotten allocation leaves no translation.
TEST(CudaIpcGpu, GtlbTranslatesExportsAndNeverAStaleOne) {
  std::string why;
  int n = probe_gpus(&why);
  if (n < 1) DMX_SKIP(::dmx::test::kNoGpu) << why;
  pid_t c = testing::fork_child([&] {
    Exporter ex;
    constexpr size_t kSize = 64 << 20;
    auto buf = Buffer::allocate({MemKind::kCuda, 0}, kSize);
    CHILD_CHECK(buf.ok(), 10);
    auto first = ex.export_region(buf->region().sub(1, 100));
    CHILD_CHECK(first.ok() && first->offset == 1, 11);
    std::mt19937_64 rng(std::random_device{}());
    for (int i = 0; i < 1000; ++i) {
      size_t off = rng() % kSize, len = rng() % (kSize - off + 1);
      auto d = ex.export_region(buf->region().sub(off, len));
      CHILD_CHECK(d.ok() && d->alloc_id == first->alloc_id && d->offset == off && d->length == len, 12);
    }
    GtlbCounters t = ex.translations();
    // Misses only fill the 2 MiB pages first touched: 32 pages (33 unaligned), 1,001 exports.
    CHILD_CHECK(t.misses <= 34 && t.hits >= 1001 - 34 && t.fills == t.misses, 13);
    void* base = buf->data();
    *buf = Buffer();  // freed behind the exporter's back
    auto again = Buffer::allocate({MemKind::kCuda, 0}, kSize);
    CHILD_CHECK(again.ok(), 14);
    auto d = ex.export_region(again->region().sub(4096, 8));
    CHILD_CHECK(d.ok(), 15);
    if (again->data() == base) {  // the usual case: cudaMalloc hands the same address back
      CHILD_CHECK(d->alloc_id != first->alloc_id, 16);
      CHILD_CHECK(ex.take_retired(8) == std::vector<uint64_t>{first->alloc_id}, 17);
    }
    auto id = ex.forget(again->data());
    CHILD_CHECK(id.ok() && *id == d->alloc_id, 18);
    uint64_t misses = ex.translations().misses;
    auto fresh = ex.export_region(again->region().sub(4096, 8));
    CHILD_CHECK(fresh.ok() && fresh->alloc_id != d->alloc_id && ex.translations().misses == misses + 1, 19);
    return 0;
  });
  EXPECT_EQ(testing::wait_child(c, std::chrono::seconds(60)), 0);
}

// Batched reads (read_lists) move every byte of lists of every size, several in flight at once, and
// reuse their pinned descriptor buffers: once a round of sizes has run, later rounds in any order
// allocate none (a buffer freed to make room for a larger one made the next launch wait for the
// whole device).
TEST(CudaIpcGpu, BatchedReadsReuseTheirDescriptorBuffers) {
  std::string why;
  int n = probe_gpus(&why);
  if (n < 1) DMX_SKIP(::dmx::test::kNoGpu) << why;
  pid_t c = testing::fork_child([&] {
    constexpr size_t kSize = 64 << 20;
    auto src = Buffer::allocate({MemKind::kCuda, 0}, kSize);
    auto dst = Buffer::allocate({MemKind::kCuda, 0}, kSize);
    CHILD_CHECK(src.ok() && dst.ok(), 10);
    std::mt19937_64 rng(std::random_device{}());
    std::vector<uint8_t> from(kSize), want(kSize), got(kSize);
    for (auto& b : from) b = static_cast<uint8_t>(rng());
    CHILD_CHECK(host_to(src->region(), from).ok(), 11);
    Exporter ex;
    auto d = ex.export_region(src->region());
    CHILD_CHECK(d.ok(), 12);
    auto engine = CopyEngine::create({.device = 0, .in_process = true});
    CHILD_CHECK(engine.ok(), 13);
    CopyEngine& e = **engine;
    // Pieces per read: 5,000 and 9,000 pass the smallest buffer's 4,096 descriptors; the runs of 7
    // and 1 have pieces of several MiB, each cut into many descriptors.
    std::vector<size_t> sizes = {3000, 7, 5000, 1, 4096, 300, 9000};
    const size_t slot = kSize / sizes.size();  // each read writes its own part of dst
    uint64_t op = 0, buffers = 0;
    for (int round = 0; round < 4; ++round) {
      for (auto& b : want) b = static_cast<uint8_t>(rng());
      CHILD_CHECK(host_to(dst->region(), want).ok(), 14);
      std::shuffle(sizes.begin(), sizes.end(), rng);
      std::vector<std::vector<CopyEngine::ListPiece>> lists(sizes.size());
      for (size_t k = 0; k < sizes.size(); ++k) {
        const size_t room = slot / sizes[k], base = k * slot;
        for (size_t i = 0; i < sizes[k]; ++i) {
          size_t len = std::min<size_t>(room, sizes[k] > 64 ? 64 << 10 : kSize) / 2 + rng() % 4;
          size_t at = base + i * room + rng() % (room - len), off = rng() % (kSize - len);
          lists[k].push_back({off, dst->region().sub(at, len)});
          std::copy_n(from.begin() + static_cast<ptrdiff_t>(off), len, want.begin() + static_cast<ptrdiff_t>(at));
        }
      }
      for (size_t k = 0; k < lists.size(); ++k) {
        CopyEngine::ListRead read{op + k, &*d, lists[k]};
        CHILD_CHECK(e.read_lists({&read, 1}, "in-process").ok(), 15);
      }
      int failures = 0;
      CHILD_CHECK(finish_all(e, op, op + lists.size() - 1, secs(60), &failures) == 0 && failures == 0, 16);
      op += lists.size();
      CHILD_CHECK(copy_memory({got.data(), kSize, {}}, dst->region()).ok(), 17);
      CHILD_CHECK(got == want, 18);
      if (round == 0) buffers = e.stats().list_buffers;
      CHILD_CHECK(buffers == sizes.size() && e.stats().list_buffers == buffers, 19);
    }
    return 0;
  });
  EXPECT_EQ(testing::wait_child(c, std::chrono::seconds(120)), 0);
}

}  // namespace
}  // namespace dmx::cuda_ipc
