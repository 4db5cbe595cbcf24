// A long write or read list is checked and laid out in parts by a crew (endpoint/vec_list.cc).
// Whatever the list, the parts give what the caller alone gives: the same segments (merged across
// the parts' edges), total and kind, or the same refusal naming the same entry. Fresh random lists
// every run: KV-cache blocks, runs of adjacent entries of every length, empty entries (whole parts
// of them), and lists with one bad entry anywhere.
#include <gtest/gtest.h>

#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "core/copy_crew.h"
#include "engine/endpoint/internal.h"
#include "engine/op.h"

namespace dmx::endpoint {
namespace {

uint64_t run_seed() {
  static const uint64_t seed = [] {
    uint64_t s = std::random_device{}();
    std::printf("seed %llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

// Never dereferenced: a list's check and layout only compute with its addresses.
char* fake(uintptr_t at) {
  return reinterpret_cast<char*>(at);
}

struct List {
  std::vector<MemRegion> local;
  std::vector<RemoteRegion> remote;
  std::vector<IoEntry> entries;
};

// The crew's build against the caller's own, field by field.
void expect_same(const List& l, bool write, CopyCrew& crew, const char* what) {
  VecBuild a = build_one_sided(l.local, l.remote, l.entries, write, nullptr);
  VecBuild b = build_one_sided(l.local, l.remote, l.entries, write, &crew);
  ASSERT_EQ(a.status.code(), b.status.code()) << what << ": " << b.status.message();
  ASSERT_EQ(a.status.message(), b.status.message()) << what;
  ASSERT_EQ(a.bad, b.bad) << what;
  ASSERT_EQ(a.layout == nullptr, b.layout == nullptr) << what;
  if (a.layout == nullptr) return;
  const VecLayout &x = *a.layout, &y = *b.layout;
  ASSERT_EQ(x.total, y.total) << what;
  ASSERT_TRUE(x.where == y.where) << what;
  ASSERT_EQ(x.segs.size(), y.segs.size()) << what;
  for (size_t k = 0; k < x.segs.size(); ++k) {
    const VecSeg &s = x.segs[k], &t = y.segs[k];
    ASSERT_TRUE(s.at == t.at && s.local == t.local && s.length == t.length && s.rkey == t.rkey &&
                s.roffset == t.roffset)
        << what << ": segment " << k << " of " << x.segs.size() << ": at " << s.at << "/" << t.at << " length "
        << s.length << "/" << t.length;
  }
}

// n blocks of `block` bytes from a local cache to a remote one, each side in a random order.
List kv_list(size_t n, uint64_t block, std::mt19937_64& rng) {
  List l;
  l.local.push_back(MemRegion{fake(1 << 20), n * block, {}});
  l.remote.push_back(RemoteRegion{0x1234, 2 * n * block});
  std::vector<uint64_t> from(n), to(2 * n);
  std::iota(from.begin(), from.end(), 0);
  std::iota(to.begin(), to.end(), 0);
  std::shuffle(from.begin(), from.end(), rng);
  std::shuffle(to.begin(), to.end(), rng);
  for (size_t i = 0; i < n; ++i) l.entries.push_back(IoEntry{0, 0, from[i] * block, to[i] * block, block});
  return l;
}

// Runs of adjacent entries, some runs crossing from one region to the next, with empty entries
// between them (and once a stretch of them longer than a part).
List run_list(size_t n, std::mt19937_64& rng) {
  List l;
  for (uint32_t r = 0; r < 4; ++r) {
    l.local.push_back(MemRegion{fake((uintptr_t{r} + 1) << 40), uint64_t{1} << 36, {}});
    l.remote.push_back(RemoteRegion{100 + r, uint64_t{1} << 36});
  }
  uint64_t lat = 0, rat = 0;
  uint32_t lr = 0, rr = 0;
  size_t run = 0;
  const size_t empty_from = rng() % n, empty_to = empty_from + 5000;
  for (size_t i = 0; i < n; ++i) {
    if (i >= empty_from && i < empty_to) {
      l.entries.push_back(IoEntry{lr, rr, lat, rat, 0});
      continue;
    }
    if (run == 0) {  // a new run: somewhere else on one side or both, or in another region
      run = 1 + (rng() % 4 == 0 ? rng() % 20000 : rng() % 8);
      switch (rng() % 4) {
        case 0:
          lat += 1 + rng() % 100;
          break;
        case 1:
          rat += 1 + rng() % 100;
          break;
        case 2:
          rr = static_cast<uint32_t>(rng() % 4);
          break;
        default:
          lr = static_cast<uint32_t>(rng() % 4);
          break;
      }
    }
    --run;
    uint64_t len = rng() % 16 == 0 ? 0 : 1 + rng() % 3000;
    l.entries.push_back(IoEntry{lr, rr, lat, rat, len});
    lat += len;
    rat += len;
  }
  return l;
}

TEST(VecListParts, KvCacheListsAsTheCallerAlone) {
  std::mt19937_64 rng(run_seed());
  CopyCrew crew(3);
  for (size_t n : {16383u, 16384u, 16385u, 65536u, 100000u}) {
    for (uint64_t block : {16384u, 65536u, 4097u}) {
      List l = kv_list(n, block, rng);
      expect_same(l, /*write=*/true, crew, "write");
      expect_same(l, /*write=*/false, crew, "read");
      VecBuild b = build_one_sided(l.local, l.remote, l.entries, true, &crew);
      ASSERT_TRUE(b.status.ok()) << b.status.message();
      EXPECT_EQ(b.layout->total, n * block);
    }
  }
}

TEST(VecListParts, RunsAcrossThePartsEdgesMergeAsTheCallerAlone) {
  std::mt19937_64 rng(run_seed() + 1);
  CopyCrew crew(4);
  for (int round = 0; round < 20; ++round) {
    List l = run_list(20000 + rng() % 100000, rng);
    expect_same(l, true, crew, "write");
    expect_same(l, false, crew, "read");
  }
  // One run from the first entry to the last, empty entries in it: one segment.
  List l = run_list(1, rng);  // its regions
  l.entries.clear();
  uint64_t at = 0;
  for (size_t i = 0; i < 50000; ++i) {
    uint64_t len = (i / 4096) % 3 == 1 ? 0 : 100;  // every third part of 4,096 entries empty
    l.entries.push_back(IoEntry{0, 0, at, at, len});
    at += len;
  }
  VecBuild b = build_one_sided(l.local, l.remote, l.entries, true, &crew);
  ASSERT_TRUE(b.status.ok()) << b.status.message();
  ASSERT_EQ(b.layout->segs.size(), 1u);
  EXPECT_EQ(b.layout->segs[0].length, at);
  expect_same(l, true, crew, "one run");
}

TEST(VecListParts, ABadEntryAnywhereIsNamedAsByTheCallerAlone) {
  std::mt19937_64 rng(run_seed() + 2);
  CopyCrew crew(3);
  const size_t n = 40000;
  for (int round = 0; round < 12; ++round) {
    for (int kind = 0; kind < 9; ++kind) {
      List l = kv_list(n, 16384, rng);
      size_t i = rng() % n;
      IoEntry& e = l.entries[i];
      switch (kind) {
        case 0:
          e.local = 1;
          break;  // no such local region
        case 1:
          e.remote = 7;
          break;  // no such remote region
        case 2:
          e.local_offset = l.local[0].size - 100;
          break;  // past the local region
        case 3:
          e.remote_offset = UINT64_MAX - 10;
          break;  // past the remote one, wrapping
        case 4:
          e.remote_offset = l.entries[(i + 1 + rng() % (n - 1)) % n].remote_offset + 1;
          break;
        case 5:
          e.local_offset = l.entries[(i + 1 + rng() % (n - 1)) % n].local_offset;
          break;  // a read's overlap
        case 6:   // a second local region of another kind, used here and there from entry i on
          l.local.push_back(MemRegion{fake(1 << 30), l.local[0].size, MemSpec{MemKind::kSim, 3}});
          for (size_t j = i; j < n; j += 1 + rng() % 5000) l.entries[j].local = 1;
          break;
        case 7:  // the same, for every entry from a part's first (parts of 4,096 entries) on
          l.local.push_back(MemRegion{fake(1 << 30), l.local[0].size, MemSpec{MemKind::kSim, 3}});
          for (size_t j = (1 + rng() % (n / 4096 - 1)) * 4096; j < n; ++j) l.entries[j].local = 1;
          break;
        default:  // GPU memory: refused where there is none, as alone
          l.local[0].where = MemSpec{MemKind::kCuda, 0};
          break;
      }
      expect_same(l, true, crew, "write");
      expect_same(l, false, crew, "read");
      VecBuild b = build_one_sided(l.local, l.remote, l.entries, kind != 5, &crew);
      if (kind < 8) {
        EXPECT_FALSE(b.status.ok()) << "kind " << kind;
      }
    }
  }
  // Totals past 2^64: refused at the entry that passes it, as alone.
  List l;
  l.local.push_back(MemRegion{fake(1 << 20), UINT64_MAX, {}});
  l.remote.push_back(RemoteRegion{9, UINT64_MAX});
  for (size_t i = 0; i < n; ++i) l.entries.push_back(IoEntry{0, 0, i, i, i % 9000 == 8999 ? uint64_t{1} << 62 : 0});
  expect_same(l, true, crew, "overflow");
  VecBuild b = build_one_sided(l.local, l.remote, l.entries, true, &crew);
  EXPECT_EQ(b.status.code(), Code::kOutOfRange) << b.status.message();
}

// A read's READ_REQ frames carry every segment once, in order: tables of at most 1,024 entries,
// a segment of 4 GiB or more alone, every frame but the last marked "more"; the crew's frames
// are the caller's, byte for byte.
TEST(VecListParts, ReadRequestTablesCarryEverySegmentInOrder) {
  std::mt19937_64 rng(run_seed() + 3);
  CopyCrew crew(3);
  for (size_t n : {size_t{0}, size_t{1}, size_t{1024}, size_t{1025}, size_t{16383}, size_t{16384}, size_t{100000}}) {
    for (int big : {0, 1, 7}) {  // segments too long for a table entry
      VecLayout l;
      l.segs.resize(n);
      uint64_t at = 0;
      for (VecSeg& s : l.segs) {
        s = VecSeg{at, fake(at), 1 + rng() % 70000, rng() % 5, rng()};
        at += s.length;
      }
      for (int k = 0; k < big && n > 0; ++k) l.segs[rng() % n].length = UINT32_MAX + 1 + rng() % 1000;
      if (big == 1 && n > 1) l.segs[n - 1].length = uint64_t{1} << 33;  // the last alone
      std::vector<ControlFrame> a = read_req_frames(l, nullptr), b = read_req_frames(l, &crew);
      ASSERT_EQ(a.size(), b.size());
      size_t k = 0;
      for (size_t f = 0; f < a.size(); ++f) {
        const wire::FrameHeader &h = a[f].first, &g = b[f].first;
        ASSERT_TRUE(h.flags == g.flags && h.a0 == g.a0 && h.a1 == g.a1 && h.a2 == g.a2 &&
                    h.payload_len == g.payload_len && a[f].second == b[f].second)
            << "frame " << f << " of " << a.size() << ", " << n << " segments";
        ASSERT_EQ((h.flags & wire::kFlagMore) != 0, f + 1 < a.size()) << "frame " << f;
        ASSERT_NE(h.flags & wire::kFlagVector, 0u);
        if ((h.flags & wire::kFlagTable) == 0) {  // one segment, too long for an entry
          ASSERT_LT(k, n);
          const VecSeg& s = l.segs[k++];
          ASSERT_GT(s.length, UINT32_MAX);
          ASSERT_TRUE(h.a0 == s.rkey && h.a1 == s.roffset && h.a2 == s.length && a[f].second.empty()) << "frame " << f;
          continue;
        }
        ASSERT_TRUE(h.a0 >= 1 && h.a0 <= wire::kMaxTableEntries) << h.a0;
        ASSERT_EQ(a[f].second.size(), h.a0 * wire::kTableEntrySize);
        ASSERT_EQ(h.payload_len, a[f].second.size());
        // A table is full unless a long segment or the list's end follows it.
        if (h.a0 < wire::kMaxTableEntries && k + h.a0 < n) {
          ASSERT_GT(l.segs[k + h.a0].length, UINT32_MAX);
        }
        for (size_t e = 0; e < h.a0; ++e) {
          ASSERT_LT(k, n);
          const VecSeg& s = l.segs[k++];
          wire::TableEntry t = wire::get_table_entry(a[f].second.data() + e * wire::kTableEntrySize);
          ASSERT_TRUE(t.key == s.rkey && t.offset == s.roffset && t.length == s.length)
              << "frame " << f << " entry " << e << ", segment " << k - 1;
        }
      }
      EXPECT_EQ(k, n) << "segments carried";
    }
  }
}

}  // namespace
}  // namespace dmx::endpoint
