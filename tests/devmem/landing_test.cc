// devmem's memory from the machine's placement (devmem.h: placement_memory, place_memory) on the
// server fixtures: the GPU pool nearest the NIC and the gatherer's GPU, booked per use and peer
// while held, grown by an extent where the pool has no room; the placement's refusal otherwise,
// and then the path's own memory, saying why.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "devmem/host_arenas.h"
#include "topo/p2pmem_double.h"
#include "topo/placement.h"
#include "topo/report.h"
#include "topo/topo_fixture.h"
#include "transport/devmem/devmem.h"

namespace dmx::devmem {
namespace {

using testing::held_by;

struct Arenas {
  std::vector<std::unique_ptr<std::vector<unsigned char>>> blocks;
  topo::DeviceMemory hook() {
    return topo::DeviceMemory{[this](int, uint64_t bytes) -> Result<void*> {
                                blocks.push_back(std::make_unique<std::vector<unsigned char>>(bytes));
                                return static_cast<void*>(blocks.back()->data());
                              },
                              [](int, void*, uint64_t) {}};
  }
};

const topo::PoolUsage* pool_named(const std::vector<topo::PoolUsage>& pools, const std::string& name) {
  for (const auto& u : pools)
    if (u.desc.name == name) return &u;
  return nullptr;
}

TEST(DevmemLanding, ZoneComesFromTheGpuPoolBesideTheNic) {
  Arenas arenas;
  auto topo = std::make_shared<const topo::Topology>(topo::testing::load("dual-socket-icelake"));
  auto placement = topo::Placement::create(topo, std::make_shared<topo::testing::P2pmemDouble>(), arenas.hook(),
                                           64 << 20);
  int asked = 0;
  auto seam = placement_memory(
      [&]() -> Result<std::shared_ptr<topo::Placement>> {
        ++asked;
        return placement;
      },
      "ens2", 1, MemSpec{MemKind::kCuda, 1});
  auto z = seam(MemoryUse::kLanding, 16 << 20, "peer:1");
  ASSERT_TRUE(z.ok()) << z.status().to_string();
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(z->region.where, (MemSpec{MemKind::kCuda, 1}));
  EXPECT_EQ(z->region.size, 16u << 20);
  ASSERT_EQ(arenas.blocks.size(), 1u);
  EXPECT_EQ(z->region.ptr, arenas.blocks[0]->data());
  EXPECT_NE(z->where.find("GPU pool cuda:1 (0000:83:00.0)"), std::string::npos) << z->where;
  EXPECT_NE(z->where.find("nearest ens2 and cuda:1"), std::string::npos) << z->where;
  EXPECT_EQ(held_by(*placement, "devmem landing zone of ens2 to peer:1"), 16u << 20);
  std::vector<unsigned char> data(z->region.size);
  std::mt19937_64 rng(std::random_device{}());
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  std::memcpy(z->region.ptr, data.data(), data.size());
  EXPECT_EQ(std::memcmp(z->region.ptr, data.data(), data.size()), 0);
  z->keep.reset();  // the path let go of it
  EXPECT_EQ(held_by(*placement, "devmem landing zone of ens2 to peer:1"), 0u);

  // The placement's refusal is the seam's: a NIC that reaches no GPU, a placement that cannot be had.
  auto h200 = topo::Placement::create(std::make_shared<const topo::Topology>(topo::testing::load("gpu-h200x2")),
                                      std::make_shared<topo::testing::P2pmemDouble>(), arenas.hook());
  auto far = placement_memory([&]() -> Result<std::shared_ptr<topo::Placement>> { return h200; }, "eth0", 0,
                              MemSpec{MemKind::kCuda, 0})(MemoryUse::kLanding, 4096, "peer:1");
  ASSERT_FALSE(far.ok());
  EXPECT_NE(far.status().message().find("devmem landing zone of eth0 to peer:1"), std::string::npos)
      << far.status().message();
  EXPECT_NE(far.status().message().find("cannot reach"), std::string::npos) << far.status().message();
  auto none = placement_memory(
      []() -> Result<std::shared_ptr<topo::Placement>> { return Status(Code::kUnavailable, "topology of /x unknown"); },
      "ens2", 1, MemSpec{MemKind::kCuda, 1})(MemoryUse::kLanding, 4096, "peer:1");
  EXPECT_EQ(none.status().code(), Code::kUnavailable);
  EXPECT_NE(none.status().message().find("topology of /x unknown"), std::string::npos);
}

// The RX pool, TX rings and zcrx areas (the memory the NIC is bound to) come from the GPU pool
// nearest the NIC and GPU in whole pages, each booked to its use and peer; what does not fit in the
// published 64 MiB grows the pool by an extent of exactly its size, which goes back with it. The
// books are what `dmx topo` prints (render_pools_text).
TEST(DevmemLanding, PoolRingAndAreaComeFromTheNearestGpuPoolWhichGrows) {
  testing::HostArenas arenas;
  {
    auto topo = std::make_shared<const topo::Topology>(topo::testing::load("dual-socket-icelake"));
    auto placement = topo::Placement::create(topo, std::make_shared<topo::testing::P2pmemDouble>(), arenas.hook(),
                                             64 << 20);
    auto seam = placement_memory([&]() -> Result<std::shared_ptr<topo::Placement>> { return placement; }, "ens1", 0,
                                 MemSpec{MemKind::kCuda, 0});
    auto landing = seam(MemoryUse::kLanding, (4 << 20) + 100, "peer:1");  // the pool's next free byte is unaligned
    auto ring = seam(MemoryUse::kTxRing, 32 << 20, "peer:1");
    auto pool = seam(MemoryUse::kRxPool, 256 << 20, "");
    auto area = seam(MemoryUse::kZcrxArea, 256 << 20, "peer:2");
    for (auto* m : {&landing, &ring, &pool, &area}) ASSERT_TRUE(m->ok()) << m->status().to_string();
    for (auto* m : {&ring, &pool, &area})
      EXPECT_EQ(reinterpret_cast<uintptr_t>((*m)->region.ptr) % 4096, 0u) << (*m)->where;
    EXPECT_EQ(ring->region.size, 32u << 20);
    EXPECT_EQ(pool->region.size, 256u << 20);
    EXPECT_NE(ring->where.find("GPU pool cuda:0 (0000:03:00.0) ("), std::string::npos) << ring->where;
    EXPECT_NE(pool->where.find("GPU pool cuda:0 (0000:03:00.0) extent "), std::string::npos) << pool->where;
    EXPECT_EQ(arenas.allocated, 3) << "the pool's arena, then an extent each for the RX pool and the zcrx area";
    std::vector<topo::PoolUsage> books = placement->usage();
    const topo::PoolUsage* gpu0 = pool_named(books, "cuda:0 (0000:03:00.0)");
    ASSERT_NE(gpu0, nullptr);
    EXPECT_EQ(gpu0->owners.at("devmem TX ring of ens1 to peer:1"), 32u << 20);
    EXPECT_EQ(gpu0->owners.at("devmem landing zone of ens1 to peer:1"), (4u << 20) + 128);
    EXPECT_EQ(held_by(*placement, "devmem RX pool of ens1"), 256u << 20);
    EXPECT_EQ(held_by(*placement, "devmem zcrx area of ens1 to peer:2"), 256u << 20);
    // Bytes written through one are not seen through another.
    std::vector<unsigned char> data(ring->region.size);
    std::mt19937_64 rng(std::random_device{}());
    for (auto& b : data) b = static_cast<unsigned char>(rng());
    std::memcpy(ring->region.ptr, data.data(), data.size());
    std::memset(pool->region.ptr, 0x5A, pool->region.size);
    std::memset(landing->region.ptr, 0x3C, landing->region.size);
    EXPECT_EQ(std::memcmp(ring->region.ptr, data.data(), data.size()), 0);
    std::string text = topo::render_pools_text(*topo, books);
    EXPECT_NE(text.find("held by devmem RX pool of ens1: 256 MiB"), std::string::npos) << text;
    EXPECT_NE(text.find("held by devmem TX ring of ens1 to peer:1: 32 MiB"), std::string::npos) << text;
    // The RX pool's extent goes back with it, pool and memory.
    std::string extent = pool->where.substr(pool->where.find("cuda:0 (0000:03:00.0) extent "), 30);
    pool->keep.reset();
    EXPECT_EQ(arenas.freed, 1);
    EXPECT_EQ(held_by(*placement, "devmem RX pool of ens1"), 0u);
    size_t extents = 0;
    for (const auto& u : placement->usage()) extents += u.desc.name.find("extent") != std::string::npos;
    EXPECT_EQ(extents, 1u) << "only the zcrx area's extent is left";
    area->keep.reset();
    ring->keep.reset();
    landing->keep.reset();
    EXPECT_EQ(arenas.freed, 2);
    for (const auto& u : placement->usage()) EXPECT_EQ(u.used, 0u) << u.desc.name;

    // Without CUDA (books only) the pool cannot grow, and says so.
    auto books_only = topo::Placement::create(topo, std::make_shared<topo::testing::P2pmemDouble>());
    auto no = placement_memory([&]() -> Result<std::shared_ptr<topo::Placement>> { return books_only; }, "ens1", 0,
                               MemSpec{MemKind::kCuda, 0})(MemoryUse::kRxPool, 256 << 20, "");
    ASSERT_FALSE(no.ok());
    EXPECT_NE(no.status().message().find("cannot grow"), std::string::npos) << no.status().message();
  }
  EXPECT_EQ(arenas.freed, 3) << "the pool's arena goes with the placement";
}

// place_memory: the seam's memory where it gives memory the path can use; else the path's own
// buffer in the seams' memory, saying why it was not placed.
TEST(DevmemLanding, PlaceMemoryFallsBackToThePathsOwnSayingWhy) {
  HostSeams seams;
  seams.memory = MemSpec{MemKind::kHost, 0};
  seams.ifname = "ens1";
  auto own = place_memory(seams, MemoryUse::kTxRing, 1 << 20, "peer:1");
  ASSERT_TRUE(own.ok()) << own.status().to_string();
  EXPECT_EQ(own->region.size, 1u << 20);
  EXPECT_EQ(own->region.where, seams.memory);
  EXPECT_NE(own->where.find("not placed: these seams place nothing"), std::string::npos) << own->where;
  std::vector<std::string> asked;
  seams.place = [&](MemoryUse use, uint64_t bytes, const std::string& peer) -> Result<PlacedMemory> {
    asked.push_back(fmt::format("{} {} {}", memory_use_name(use), bytes, peer));
    if (use == MemoryUse::kRxPool) return Status(Code::kResourceExhausted, "no GPU pool reaches ens1");
    auto keep = std::make_shared<std::vector<unsigned char>>(bytes);
    MemSpec where = use == MemoryUse::kZcrxArea ? MemSpec{MemKind::kCuda, 3} : seams.memory;
    return PlacedMemory{MemRegion{keep->data(), bytes, where}, keep, "the seam's"};
  };
  auto ring = place_memory(seams, MemoryUse::kTxRing, 4096, "peer:1");
  ASSERT_TRUE(ring.ok());
  EXPECT_EQ(ring->where, "the seam's");
  auto pool = place_memory(seams, MemoryUse::kRxPool, 8192, "");
  ASSERT_TRUE(pool.ok());
  EXPECT_NE(pool->where.find("not placed: no GPU pool reaches ens1"), std::string::npos) << pool->where;
  auto area = place_memory(seams, MemoryUse::kZcrxArea, 4096, "peer:2");
  ASSERT_TRUE(area.ok());
  EXPECT_EQ(area->region.where, seams.memory);
  EXPECT_NE(area->where.find("the zcrx area must be in host"), std::string::npos) << area->where;
  EXPECT_EQ(asked, (std::vector<std::string>{"TX ring 4096 peer:1", "RX pool 8192 ", "zcrx area 4096 peer:2"}));
}

}  // namespace
}  // namespace dmx::devmem
