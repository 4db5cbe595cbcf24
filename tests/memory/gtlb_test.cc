#include "memory/gtlb.h"

#include <gtest/gtest.h>

#include <iterator>
#include <map>
#include <random>

namespace dmx {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kPage = 2 * kMiB;
constexpr uint64_t kCell = 64 << 10;

GtlbEntry alloc(uintptr_t base, uint64_t size, uint64_t value) { return GtlbEntry{base, size, value * 7, value}; }

TEST(Gtlb, HitsOnlyRangesTheAllocationHolds) {
  Gtlb g;
  const GtlbEntry a = alloc(64 * kPage, 6 * kPage, 1);
  EXPECT_FALSE(g.lookup(a.base + 5, 8));
  g.fill(a, a.base + 5, 8);
  auto hit = g.lookup(a.base + 5, 8);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->value, 1u);
  EXPECT_EQ(hit->generation, 7u);
  EXPECT_TRUE(g.lookup(a.base, kPage));                  // the whole filled page
  EXPECT_TRUE(g.lookup(a.base + kPage - 4, 8));           // from a filled page into the next
  EXPECT_FALSE(g.lookup(a.base + kPage + 4, 8));          // a page not filled yet
  EXPECT_FALSE(g.lookup(a.base - 1, 1));                  // before the allocation
  g.fill(a, a.base, a.size);
  EXPECT_TRUE(g.lookup(a.base + kPage - 4, 8));
  EXPECT_TRUE(g.lookup(a.base, a.size));                  // all of it, across pages
  EXPECT_FALSE(g.lookup(a.base + 1, a.size));             // one byte past its end
  EXPECT_FALSE(g.lookup(a.base + a.size, 1));
  EXPECT_FALSE(g.lookup(a.base + 3, UINT64_MAX));         // a length that would wrap
  GtlbCounters c = g.counters();
  EXPECT_EQ(c.main_entries, 6u);
  EXPECT_EQ(c.comp_blocks, 0u);
  EXPECT_EQ(c.fills, 2u);
}

TEST(Gtlb, PartialPagesUseComplementaryCells) {
  Gtlb g;
  // Three allocations inside one 2 MiB page (cudaMalloc packs small ones), one straddling a page.
  const uintptr_t page = 100 * kPage;
  const GtlbEntry a = alloc(page, 100 << 10, 1);                   // cells 0-1
  const GtlbEntry b = alloc(page + 4 * kCell, 3 * kCell, 2);       // cells 4-6
  const GtlbEntry c = alloc(page + kPage - kCell, kPage, 3);        // last cell, then most of the next page
  for (const GtlbEntry& e : {a, b, c}) g.fill(e, e.base, e.size);
  EXPECT_EQ(g.lookup(page + 10, 90 << 10)->value, 1u);
  EXPECT_EQ(g.lookup(page + 5 * kCell, kCell)->value, 2u);
  EXPECT_EQ(g.lookup(page + kPage - 8, 16)->value, 3u);             // across the page boundary
  EXPECT_EQ(g.lookup(page + kPage + kMiB, 8)->value, 3u);
  EXPECT_FALSE(g.lookup(page + 3 * kCell, 8));                     // a gap between allocations
  EXPECT_FALSE(g.lookup(page + (100 << 10), 8));                   // a's cell, past a's end
  GtlbCounters cnt = g.counters();
  EXPECT_EQ(cnt.main_entries, 0u);  // neither page is spanned whole by one allocation
  EXPECT_EQ(cnt.comp_blocks, 2u);
}

TEST(Gtlb, ACellSharedByTwoAllocationsNeverAnswersWithTheWrongOne) {
  Gtlb g;
  const uintptr_t page = 7 * kPage;
  const GtlbEntry a = alloc(page, 1000, 1);
  const GtlbEntry b = alloc(page + 4096, 1000, 2);  // same 64 KiB cell
  g.fill(a, a.base, 8);
  g.fill(b, b.base, 8);  // the cell now names b
  EXPECT_FALSE(g.lookup(a.base, 8));
  EXPECT_EQ(g.lookup(b.base + 10, 8)->value, 2u);
  g.fill(a, a.base, 8);
  EXPECT_EQ(g.lookup(a.base, 8)->value, 1u);
  EXPECT_FALSE(g.lookup(b.base, 8));
}

TEST(Gtlb, InvalidationLeavesNoStaleTranslation) {
  Gtlb g;
  const GtlbEntry a = alloc(10 * kPage + kCell, 5 * kPage, 1);  // partial first and last pages
  g.fill(a, a.base, a.size);
  ASSERT_TRUE(g.lookup(a.base, a.size));
  EXPECT_GT(g.invalidate(a.base, a.size), 0u);
  for (uint64_t off = 0; off < a.size; off += kCell) EXPECT_FALSE(g.lookup(a.base + off, 1)) << off;
  // The same range allocated again (another buffer) fills anew.
  const GtlbEntry again = alloc(a.base, 2 * kPage, 9);
  g.fill(again, again.base, again.size);
  EXPECT_EQ(g.lookup(again.base + kPage, 8)->value, 9u);
  EXPECT_FALSE(g.lookup(a.base + 3 * kPage, 8));
  GtlbCounters c = g.counters();
  EXPECT_GT(c.invalidations, 0u);
  // A range wider than the cache walks the cache: everything goes.
  EXPECT_GT(g.invalidate(0, UINT64_MAX), 0u);
  EXPECT_EQ(g.counters().main_entries, 0u);
  EXPECT_EQ(g.counters().comp_blocks, 0u);
}

TEST(Gtlb, StaysWithinItsLimitsAndEvicts) {
  Gtlb g(Gtlb::Limits{64, 4});
  for (uint64_t i = 0; i < 1000; ++i) {
    const GtlbEntry e = alloc((1000 + 3 * i) * kPage, kPage, i + 1);
    g.fill(e, e.base, e.size);
    ASSERT_EQ(g.lookup(e.base, e.size)->value, i + 1);  // what was just filled is there
  }
  for (uint64_t i = 0; i < 20; ++i) {
    const GtlbEntry e = alloc((5000 + 3 * i) * kPage + 512, 4096, 2000 + i);
    g.fill(e, e.base, e.size);
    ASSERT_EQ(g.lookup(e.base, 1)->value, 2000 + i);
  }
  GtlbCounters c = g.counters();
  EXPECT_EQ(c.main_entries, 64u);
  EXPECT_EQ(c.comp_blocks, 4u);
  EXPECT_EQ(c.evictions, (1000u - 64u) + (20u - 4u));
  // A page used again and again keeps its second chance while the others come and go.
  const GtlbEntry hot = alloc(9000 * kPage, kPage, 77);
  g.fill(hot, hot.base, 8);
  for (uint64_t i = 0; i < 500; ++i) {
    ASSERT_TRUE(g.lookup(hot.base, 8)) << i;
    const GtlbEntry e = alloc((20000 + i) * kPage, kPage, i + 1);
    g.fill(e, e.base, 8);
  }
}

// Against a model: random allocations come and go; every hit must name the live allocation that
// holds the range, and its generation.
TEST(Gtlb, AgreesWithAModelUnderRandomUse) {
  std::mt19937_64 rng(std::random_device{}());
  Gtlb g(Gtlb::Limits{256, 32});
  std::map<uintptr_t, GtlbEntry> live;  // base -> allocation
  uint64_t next_value = 1, hits = 0;
  const uintptr_t space = 512 * kPage;
  auto owner = [&](uintptr_t addr) -> const GtlbEntry* {
    auto it = live.upper_bound(addr);
    if (it == live.begin()) return nullptr;
    --it;
    return addr - it->first < it->second.size ? &it->second : nullptr;
  };
  for (int step = 0; step < 100000; ++step) {
    const int op = rng() % 10;
    if (op == 0) {  // allocate somewhere free, sizes from 512 B to 9 MiB
      const uint64_t size = uint64_t{512} << (rng() % 15);
      const uintptr_t base = 4 * kPage + (rng() % space) / 512 * 512;
      bool free = true;
      for (auto& [b, e] : live) free = free && !e.overlaps(base, size);
      if (free) live[base] = GtlbEntry{base, size, rng(), next_value++};
    } else if (op == 1 && !live.empty()) {  // free one (its owner invalidates)
      auto it = std::next(live.begin(), rng() % live.size());
      g.invalidate(it->second.base, it->second.size);
      live.erase(it);
    } else if (!live.empty()) {  // look up inside some allocation, fill on a miss
      const GtlbEntry& e = std::next(live.begin(), rng() % live.size())->second;
      const uint64_t off = rng() % e.size;
      const uint64_t len = rng() % (e.size - off + 1);
      auto hit = g.lookup(e.base + off, len);
      if (hit) {
        ++hits;
        ASSERT_EQ(hit->value, e.value);
        ASSERT_EQ(hit->generation, e.generation);
      } else {
        g.fill(e, e.base + off, len);
        ASSERT_TRUE(g.lookup(e.base + off, len)) << std::hex << e.base << " +" << e.size << " at " << off << " len " << len;
      }
      // And an address that may be in no allocation at all.
      const uintptr_t any = 4 * kPage + rng() % space;
      if (auto h = g.lookup(any, 1)) {
        const GtlbEntry* o = owner(any);
        ASSERT_NE(o, nullptr) << std::hex << any;
        ASSERT_EQ(h->value, o->value);
      }
    }
  }
  EXPECT_GT(hits, 10000u);
  GtlbCounters c = g.counters();
  EXPECT_LE(c.main_entries, 256u);
  EXPECT_LE(c.comp_blocks, 32u);
}

}  // namespace
}  // namespace dmx
