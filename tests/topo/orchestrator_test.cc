#include "topo/orchestrator.h"

#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "topo/topo_fixture.h"

namespace dmx::topo {
namespace {

using testing::dev;
using testing::load;

std::shared_ptr<const Topology> shared(const char* name) {
  return std::make_shared<const Topology>(load(name));
}

TEST(Orchestrator, GpuVmPicksPinnedHostForGpuPlusNic) {
  auto t = shared("gpu-vm");
  Orchestrator o(t);
  int gpu0 = dev(*t, "0000:00:06.0"), gpu1 = dev(*t, "0000:00:07.0"), nic = dev(*t, "0000:00:03.0");
  auto host = o.publish({"pinned:node0", PoolKind::kPinnedHost, -1, 0, 1 << 20, nullptr});
  auto g0 = o.publish({"cuda:0", PoolKind::kGpu, gpu0, -1, 1 << 20, nullptr});
  ASSERT_TRUE(host.ok() && g0.ok());
  int both[] = {gpu0, nic};
  auto c = o.find_many(both, 4096);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->size(), 1u);  // the GPU pool is NOT_SUPPORTED for the NIC: excluded
  EXPECT_EQ(c->front().pool, *host);
  EXPECT_EQ(c->front().total_distance, 2);  // 1 + 1 hops to the root complex
  int only_gpu[] = {gpu0};
  c = o.find_many(only_gpu, 4096);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->size(), 2u);
  EXPECT_EQ(c->front().pool, *g0);  // distance 0 beats host memory's 1
  int other_gpu[] = {gpu1};
  c = o.find_many(other_gpu, 4096);
  ASSERT_EQ(c->size(), 1u);  // GPU0 memory is NOT_SUPPORTED for GPU1 over PCIe
  EXPECT_EQ(o.numa_node_for_cuda_device(0), 0);
}

TEST(Orchestrator, IcelakePlacementAndAccounting) {
  auto t = shared("dual-socket-icelake");
  Orchestrator o(t);
  int gpu0 = dev(*t, "0000:03:00.0"), nic0 = dev(*t, "0000:04:00.0"), gpu1 = dev(*t, "0000:83:00.0");
  auto h0 = o.publish({"pinned:node0", PoolKind::kPinnedHost, -1, 0, 1 << 20, nullptr});
  auto h1 = o.publish({"pinned:node1", PoolKind::kPinnedHost, -1, 1, 1 << 20, nullptr});
  auto g0 = o.publish({"cuda:0", PoolKind::kGpu, gpu0, -1, 8192, nullptr});
  EXPECT_EQ(o.publish_p2pmem_bars(), 1);  // the NVMe CMB
  int pair[] = {gpu0, nic0};
  auto c = o.find_many(pair, 4096);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->size(), 4u);
  // GPU0 memory: 0 + 4; host node 0: 4 + 4; NVMe CMB: 6 + 6; host node 1: (4 + 10) * 2.
  EXPECT_EQ((*c)[0].pool, *g0);
  EXPECT_EQ((*c)[0].total_distance, 4);
  EXPECT_EQ((*c)[1].pool, *h0);
  EXPECT_EQ((*c)[1].total_distance, 8);
  EXPECT_EQ((*c)[2].total_distance, 12);
  EXPECT_EQ((*c)[3].pool, *h1);
  EXPECT_EQ((*c)[3].total_distance, 28);
  auto a = o.allocate(pair, 4096);
  auto b = o.allocate(pair, 4000);  // rounded up to 4032 (64-byte multiple): 64 bytes stay free
  auto spill = o.allocate(pair, 100);
  ASSERT_TRUE(a.ok() && b.ok() && spill.ok());
  EXPECT_EQ(a->pool, *g0);
  EXPECT_EQ(b->pool, *g0);
  EXPECT_EQ(b->offset, 4096u);
  EXPECT_EQ(spill->pool, *h0);  // 100 bytes do not fit in the 64 left: next nearest
  for (const PoolUsage& u : o.usage())
    if (u.id == *g0) {
      EXPECT_EQ(u.used, 8128u);
      EXPECT_EQ(u.allocations, 2u);
    }
  EXPECT_TRUE(o.free(*a).ok());
  EXPECT_FALSE(o.free(*a).ok());  // double free is reported
  auto again = o.allocate(pair, 64);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->pool, *g0);
  EXPECT_EQ(again->offset, 0u);
  // Staging for CUDA device 1 (no overlay: PCI order, GPU 83:00.0 on node 1).
  auto s = o.allocate_staging(1, 1 << 16);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->pool, *h1);
  EXPECT_EQ(o.numa_node_for_cuda_device(1), 1);
  (void)gpu1;
}

TEST(Orchestrator, UnpublishExhaustionAndErrors) {
  auto t = shared("switch-cascade-amd");
  Orchestrator o(t);
  int gpu_a = dev(*t, "0000:05:00.0"), vf = dev(*t, "0000:07:00.2");
  char backing[1024];
  auto g = o.publish({"cuda:0", PoolKind::kGpu, gpu_a, -1, sizeof(backing), backing});
  ASSERT_TRUE(g.ok());
  int clients[] = {gpu_a, vf};
  auto a = o.allocate(clients, 512);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->ptr, backing);
  auto too_big = o.allocate(clients, 1024);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), Code::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("free in one piece"), std::string::npos) << too_big.status().message();
  ASSERT_TRUE(o.unpublish(*g).ok());
  EXPECT_FALSE(o.unpublish(*g).ok());
  auto hidden = o.find_many(clients, 64);
  ASSERT_TRUE(hidden.ok());
  EXPECT_TRUE(hidden->empty());
  EXPECT_EQ(o.usage().size(), 1u);  // kept until its allocation is freed
  EXPECT_TRUE(o.free(*a).ok());
  EXPECT_TRUE(o.usage().empty());
  int bad[] = {99999};
  EXPECT_EQ(o.find_many(bad, 64).status().code(), Code::kInvalidArgument);
  EXPECT_FALSE(o.publish({"x", PoolKind::kGpu, 4242, -1, 64, nullptr}).ok());
  EXPECT_FALSE(o.publish({"x", PoolKind::kPinnedHost, -1, 0, 0, nullptr}).ok());
  EXPECT_EQ(o.allocate_staging(0, 64).status().code(), Code::kResourceExhausted);
}

// Aligned allocations (memory exported as a dma-buf: whole pages): the offset is a multiple of
// the alignment, the bytes skipped before it stay free and are used by later requests; a pool
// published already full (an extent for one request) is seen by nobody, and is forgotten once
// unpublished and freed.
TEST(Orchestrator, AlignedAllocationsAndPoolsPublishedFull) {
  auto t = shared("switch-cascade-amd");
  Orchestrator o(t);
  int gpu_a = dev(*t, "0000:05:00.0");
  auto g = o.publish({"cuda:0", PoolKind::kGpu, gpu_a, -1, 64 << 10, nullptr});
  ASSERT_TRUE(g.ok());
  auto small = o.allocate_from(*g, 100, "small");
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->offset, 0u);
  auto page = o.allocate_from(*g, 8192, "page", 4096);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->offset, 4096u);
  auto gap = o.allocate_from(*g, 3000, "gap");  // the bytes skipped before the page
  ASSERT_TRUE(gap.ok());
  EXPECT_EQ(gap->offset, 128u);
  auto big = o.allocate_from(*g, 52 << 10, "big", 4096);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->offset, 12288u);
  EXPECT_EQ(o.allocate_from(*g, 4096, "more", 4096).status().code(), Code::kResourceExhausted);
  EXPECT_EQ(o.allocate_from(*g, 64, "odd", 96).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(o.allocate_from(*g, 64, "tiny", 8).status().code(), Code::kInvalidArgument);
  for (auto* a : {&small, &page, &gap, &big}) EXPECT_TRUE(o.free(**a).ok());
  auto whole = o.allocate_from(*g, 64 << 10, "whole", 4096);
  ASSERT_TRUE(whole.ok()) << "the freed ranges merged again";
  EXPECT_TRUE(o.free(*whole).ok());

  auto ext = o.publish_allocated({"cuda:0 extent 1", PoolKind::kGpu, gpu_a, -1, 0, nullptr}, 1000, "ring");
  ASSERT_TRUE(ext.ok()) << ext.status().to_string();
  EXPECT_EQ(ext->size, 1024u);
  int clients[] = {gpu_a};
  auto seen = o.find_many(clients, 64);
  ASSERT_TRUE(seen.ok());
  ASSERT_EQ(seen->size(), 1u);
  EXPECT_EQ(seen->front().pool, *g) << "the extent has no room for anyone else";
  EXPECT_EQ(o.usage().size(), 2u);
  EXPECT_EQ(o.usage().back().owners.at("ring"), 1024u);
  ASSERT_TRUE(o.unpublish(ext->pool).ok());
  EXPECT_TRUE(o.free(*ext).ok());
  EXPECT_EQ(o.usage().size(), 1u);
  EXPECT_FALSE(o.publish_allocated({"x", PoolKind::kGpu, 4242, -1, 0, nullptr}, 64, "x").ok());
  EXPECT_FALSE(o.publish_allocated({"x", PoolKind::kGpu, gpu_a, -1, 0, nullptr}, 0, "x").ok());
}

TEST(Orchestrator, ConcurrentAllocateFreeKeepsTheBooks) {
  auto t = shared("gpu-vm");
  Orchestrator o(t);
  auto h = o.publish({"pinned:node0", PoolKind::kPinnedHost, -1, 0, 1 << 20, nullptr});
  ASSERT_TRUE(h.ok());
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&] {
      for (int k = 0; k < 500; ++k) {
        auto a = o.allocate_staging(0, 1000);
        ASSERT_TRUE(a.ok());
        ASSERT_TRUE(o.free(*a).ok());
      }
    });
  for (auto& th : threads) th.join();
  auto u = o.usage();
  ASSERT_EQ(u.size(), 1u);
  EXPECT_EQ(u[0].used, 0u);
  EXPECT_EQ(u[0].total_allocations, 2000u);
  EXPECT_EQ(u[0].peak % 1024, 0u);
}

}  // namespace
}  // namespace dmx::topo

namespace dmx::topo {
namespace {

TEST(Orchestrator, FromDiscoverLocal) {
  auto t = discover_local(testing::fixture_root("dual-socket-haswell"));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_FALSE((*t)->cuda.available);
  EXPECT_NE((*t)->cuda.reason.find("not this machine"), std::string::npos);
  Orchestrator o(*t);
  ASSERT_TRUE(o.publish({"pinned:node0", PoolKind::kPinnedHost, -1, 0, 1 << 20, nullptr}).ok());
  ASSERT_TRUE(o.publish({"pinned:node1", PoolKind::kPinnedHost, -1, 1, 1 << 20, nullptr}).ok());
  auto s = o.allocate_staging(1, 4096);  // second GPU in PCI order: 81:00.0 on node 1
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(o.usage()[1].used, 4096u);
  EXPECT_FALSE(discover_local("/nonexistent").ok());
}

}  // namespace
}  // namespace dmx::topo
