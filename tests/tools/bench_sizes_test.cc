// dmx bench's size range (nccl-tests -b/-e/-f) and its sample rule (tools/dmx/bench_sizes.cc).
#include <gtest/gtest.h>

#include "tools/dmx/bench.h"

namespace dmx::bench {
namespace {

TEST(BenchSizes, RangeStopsAtOrBelowMax) {
  auto r = size_range(8, 64 << 10, 4);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (std::vector<uint64_t>{8, 32, 128, 512, 2048, 8192, 32768}));
  r = size_range(1, 1, 2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, std::vector<uint64_t>{1});
  r = size_range(uint64_t{1} << 62, UINT64_MAX, 2);  // no wrap past 2^64
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->size(), 2u);
}

TEST(BenchSizes, RangeRefusesNonsense) {
  EXPECT_FALSE(size_range(0, 8, 2).ok());
  EXPECT_FALSE(size_range(16, 8, 2).ok());
  EXPECT_FALSE(size_range(8, 16, 1).ok());
}

TEST(BenchSizes, SampleRule) {
  EXPECT_EQ(latency_samples(0), kMinSamples);
  EXPECT_EQ(latency_samples(20e-6), kMinSamples);
  EXPECT_EQ(latency_samples(kLatencyBudgetSeconds / kMinSamples), kMinSamples);
  EXPECT_EQ(latency_samples(0.01), 200u);  // 1,000 would take 10 s: as many as fit in 2 s
  EXPECT_EQ(latency_samples(1.0), kMinLargeSamples);
  EXPECT_EQ(throughput_iters(8), 2000u);
  EXPECT_EQ(throughput_iters(uint64_t{1} << 30), 8u);
}

}  // namespace
}  // namespace dmx::bench
