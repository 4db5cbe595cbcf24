// The registry of memory registered for devmem TX: sends find their region through a GTLB, and a
// released region is never found again.
#include <gtest/gtest.h>

#include <vector>

#include "transport/devmem/tx_regions.h"

namespace dmx::devmem {
namespace {

TEST(DevmemTxRegions, GtlbFindsTheRegionOfASendAndForgetsReleasedOnes) {
  std::vector<char> a(8 << 20), b(3 << 20);
  MemRegion ma{a.data(), a.size(), {}}, mb{b.data(), b.size(), {}};
  auto ra = register_tx_region(ma);
  auto rb = register_tx_region(mb);
  GtlbCounters c0 = tx_region_translations();
  EXPECT_EQ(find_tx_region(ma.sub(100, 5000)), ra);
  GtlbCounters c1 = tx_region_translations();
  EXPECT_EQ(c1.misses, c0.misses + 1);
  EXPECT_EQ(c1.fills, c0.fills + 1);
  for (size_t off : {size_t(7), size_t(2000)}) EXPECT_EQ(find_tx_region(ma.sub(off, 3000)), ra);
  EXPECT_EQ(tx_region_translations().hits, c1.hits + 2);  // the same page: a lookup each, no scan
  EXPECT_EQ(find_tx_region(mb.sub(1, mb.size - 1)), rb);
  EXPECT_EQ(find_tx_region(ma.sub(ma.size - 10, 10)), ra);
  // Not inside one region, another kind of memory, or nothing at all: none.
  EXPECT_EQ(find_tx_region(MemRegion{a.data() + a.size() - 10, 20, {}}), nullptr);
  EXPECT_EQ(find_tx_region(MemRegion{a.data(), 100, MemSpec{MemKind::kPinned, 0}}), nullptr);
  EXPECT_EQ(find_tx_region(ma.sub(0, 0)), nullptr);
  // Released: its translations go with it, and memory registered again there is the new region.
  ra.reset();
  EXPECT_EQ(find_tx_region(ma.sub(100, 5000)), nullptr);
  EXPECT_GT(tx_region_translations().invalidations, c0.invalidations);
  auto again = register_tx_region(ma.sub(0, 4 << 20));
  EXPECT_EQ(find_tx_region(ma.sub(100, 5000)), again);
  EXPECT_EQ(find_tx_region(ma.sub(5 << 20, 10)), nullptr);  // past the new, smaller region
}

}  // namespace
}  // namespace dmx::devmem
