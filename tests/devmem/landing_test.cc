// devmem's landing zones from the machine's placement (devmem.h: placement_landing) on the server
// fixtures: the GPU pool nearest the NIC and the gatherer's GPU, booked to the NIC's landing zone
// while held; the placement's refusal otherwise.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "topo/p2pmem_double.h"
#include "topo/placement.h"
#include "topo/topo_fixture.h"
#include "transport/devmem/devmem.h"

namespace dmx::devmem {
namespace {

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

uint64_t held_by(const topo::Placement& p, const std::string& owner) {
  uint64_t n = 0;
  for (const auto& u : p.usage())
    if (auto it = u.owners.find(owner); it != u.owners.end()) n += it->second;
  return n;
}

TEST(DevmemLanding, ZoneComesFromTheGpuPoolBesideTheNic) {
  Arenas arenas;
  auto topo = std::make_shared<const topo::Topology>(topo::testing::load("dual-socket-icelake"));
  auto placement = topo::Placement::create(topo, std::make_shared<topo::testing::P2pmemDouble>(), arenas.hook(),
                                           64 << 20);
  int asked = 0;
  auto seam = placement_landing(
      [&]() -> Result<std::shared_ptr<topo::Placement>> {
        ++asked;
        return placement;
      },
      "ens2", 1);
  auto z = seam(16 << 20);
  ASSERT_TRUE(z.ok()) << z.status().to_string();
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(z->region.where, (MemSpec{MemKind::kCuda, 1}));
  EXPECT_EQ(z->region.size, 16u << 20);
  ASSERT_EQ(arenas.blocks.size(), 1u);
  EXPECT_EQ(z->region.ptr, arenas.blocks[0]->data());
  EXPECT_NE(z->where.find("GPU pool cuda:1 (0000:83:00.0)"), std::string::npos) << z->where;
  EXPECT_NE(z->where.find("nearest ens2 and cuda:1"), std::string::npos) << z->where;
  EXPECT_EQ(held_by(*placement, "devmem landing zone of ens2"), 16u << 20);
  std::vector<unsigned char> data(z->region.size);
  std::mt19937_64 rng(std::random_device{}());
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  std::memcpy(z->region.ptr, data.data(), data.size());
  EXPECT_EQ(std::memcmp(z->region.ptr, data.data(), data.size()), 0);
  z->keep.reset();  // the path let go of it
  EXPECT_EQ(held_by(*placement, "devmem landing zone of ens2"), 0u);

  // The placement's refusal is the seam's: a NIC that reaches no GPU, a placement that cannot be had.
  auto h200 = topo::Placement::create(std::make_shared<const topo::Topology>(topo::testing::load("gpu-h200x2")),
                                      std::make_shared<topo::testing::P2pmemDouble>(), arenas.hook());
  auto far = placement_landing([&]() -> Result<std::shared_ptr<topo::Placement>> { return h200; }, "eth0", 0)(4096);
  ASSERT_FALSE(far.ok());
  EXPECT_NE(far.status().message().find("devmem landing zone of eth0"), std::string::npos) << far.status().message();
  EXPECT_NE(far.status().message().find("cannot reach"), std::string::npos) << far.status().message();
  auto none = placement_landing(
      []() -> Result<std::shared_ptr<topo::Placement>> { return Status(Code::kUnavailable, "topology of /x unknown"); },
      "ens2", 1)(4096);
  EXPECT_EQ(none.status().code(), Code::kUnavailable);
  EXPECT_NE(none.status().message().find("topology of /x unknown"), std::string::npos);
}

}  // namespace
}  // namespace dmx::devmem
