// The machine's placement on the server fixtures: GPU pools per device (real memory from the
// engine's hook on first use), p2pmem through the kernel's allocate file (a double that answers as
// the kernel does), staging by the P2PDMA rule, and the books of who holds what.
#include "topo/placement.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "topo/p2pmem_double.h"
#include "topo/topo_fixture.h"

namespace dmx::topo {
namespace {

using testing::P2pmemDouble;

std::shared_ptr<const Topology> shared(const char* name) {
  return std::make_shared<const Topology>(testing::load(name));
}

std::string allocate_file(const Topology& t, const char* bdf) {
  return t.root + "/" + t.devices[testing::dev(t, bdf)].path + "/p2pmem/allocate";
}

std::vector<unsigned char> random_bytes(size_t n) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

const PoolUsage* pool_named(const std::vector<PoolUsage>& u, const std::string& part) {  // points into `u`
  for (const auto& p : u)
    if (p.desc.name.find(part) != std::string::npos) return &p;
  return nullptr;
}

// A GPU pool per GPU on every server fixture, named by CUDA ordinal (PCI order without an overlay)
// and address, on the GPU's device; books only without a memory hook.
TEST(Placement, PublishesAGpuPoolPerDeviceOnTheServerFixtures) {
  struct Case {
    const char* fixture;
    std::vector<const char*> gpus;
  };
  for (const Case& c : {Case{"gpu-vm", {"0000:00:06.0", "0000:00:07.0"}},
                        Case{"gpu-h200x2", {"0000:00:06.0", "0000:00:07.0"}},
                        Case{"h100-vm", {"0000:00:06.0"}},
                        Case{"dual-socket-icelake", {"0000:03:00.0", "0000:83:00.0"}},
                        Case{"switch-cascade-amd", {"0000:05:00.0", "0000:06:00.0"}}}) {
    SCOPED_TRACE(c.fixture);
    auto t = shared(c.fixture);
    auto p = Placement::create(t, std::make_shared<P2pmemDouble>());
    std::vector<PoolUsage> u = p->usage();
    size_t gpu_pools = 0;
    for (const auto& pool : u) {
      if (pool.desc.kind != PoolKind::kGpu) continue;
      ASSERT_LT(gpu_pools, c.gpus.size());
      EXPECT_EQ(pool.desc.name, fmt::format("cuda:{} ({})", gpu_pools, c.gpus[gpu_pools]));
      EXPECT_EQ(pool.desc.pci, testing::dev(*t, c.gpus[gpu_pools]));
      EXPECT_EQ(pool.desc.capacity, Placement::kDefaultGpuPoolBytes);
      ++gpu_pools;
    }
    EXPECT_EQ(gpu_pools, c.gpus.size());
    EXPECT_EQ(u.size() - gpu_pools, t->numa.size() + (std::string(c.fixture) == "dual-socket-icelake" ? 1u : 0u))
        << "a pinned pool per NUMA node, plus the icelake NVMe's published p2pmem";
    std::string first[] = {c.gpus[0]};
    auto b = p->allocate_gpu(first, 4096, "test");
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(b->data(), nullptr);  // books only: no hook
    EXPECT_EQ(b->cuda_device(), 0);
  }
}

// GPU memory for a GPU and the NIC beside it, from the engine's hook on first use: the GPU whose
// P2PDMA distance to both is smallest, with real memory behind it; freed bookings are reused.
TEST(Placement, GpuPoolsHaveRealMemoryFromTheHookOnFirstUse) {
  auto t = shared("dual-socket-icelake");
  struct Arena {
    int ordinal;
    std::vector<unsigned char> bytes;
  };
  auto arenas = std::make_shared<std::vector<std::unique_ptr<Arena>>>();
  int frees = 0;
  DeviceMemory hook{[arenas](int ordinal, uint64_t bytes) -> Result<void*> {
                      arenas->push_back(std::make_unique<Arena>(Arena{ordinal, std::vector<unsigned char>(bytes)}));
                      return static_cast<void*>(arenas->back()->bytes.data());
                    },
                    [&frees](int, void*, uint64_t) { ++frees; }};
  {
    auto p = Placement::create(t, std::make_shared<P2pmemDouble>(), hook, 1 << 20);
    EXPECT_TRUE(arenas->empty()) << "publishing allocates nothing";
    std::string socket1[] = {"0000:83:00.0", "0000:84:00.0"};  // GPU and NIC behind socket 1's switch
    auto a = p->allocate_gpu(socket1, 100000, "landing zone of nic 84:00.0");
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    ASSERT_EQ(arenas->size(), 1u);
    EXPECT_EQ(arenas->front()->ordinal, 1);
    EXPECT_EQ(a->cuda_device(), 1);
    EXPECT_EQ(a->data(), arenas->front()->bytes.data());
    auto data = random_bytes(100000);
    std::memcpy(a->data(), data.data(), data.size());
    auto b = p->allocate_gpu(socket1, 5000, "second");
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(arenas->size(), 1u) << "one arena per pool";
    EXPECT_EQ(static_cast<unsigned char*>(b->data()), arenas->front()->bytes.data() + 100032);
    EXPECT_EQ(std::memcmp(a->data(), data.data(), data.size()), 0);
    std::vector<PoolUsage> books = p->usage();
    const PoolUsage* gpu1 = pool_named(books, "cuda:1");
    ASSERT_NE(gpu1, nullptr);
    EXPECT_EQ(gpu1->owners.at("landing zone of nic 84:00.0"), 100032u);
    EXPECT_EQ(gpu1->owners.at("second"), 5056u);
    a->reset();
    books = p->usage();
    gpu1 = pool_named(books, "cuda:1");
    EXPECT_EQ(gpu1->owners.count("landing zone of nic 84:00.0"), 0u);
    EXPECT_EQ(gpu1->used, 5056u);
    // Too big for any GPU pool both clients reach: says which and why.
    auto big = p->allocate_gpu(socket1, 2 << 20, "big");
    ASSERT_FALSE(big.ok());
    EXPECT_EQ(big.status().code(), Code::kResourceExhausted);
    EXPECT_NE(big.status().message().find("free in one piece"), std::string::npos) << big.status().message();
  }
  EXPECT_EQ(frees, 1) << "the arena goes back when the placement ends";
}

// On the GPU machine's fixture the kernel cannot map GPU memory for the NIC (host bridge not
// whitelisted): no GPU pool qualifies, and the refusal says why.
TEST(Placement, GpuPoolsTheNicCannotReachAreRefusedWithTheReason) {
  auto t = shared("gpu-h200x2");
  auto p = Placement::create(t, std::make_shared<P2pmemDouble>());
  std::string pair[] = {"0000:00:06.0", "0000:00:03.0"};
  auto a = p->allocate_gpu(pair, 4096, "landing zone");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), Code::kResourceExhausted);
  EXPECT_NE(a.status().message().find("cannot reach 0000:00:03.0"), std::string::npos) << a.status().message();
  std::string unknown[] = {"0000:42:00.0"};
  EXPECT_EQ(p->allocate_gpu(unknown, 64, "x").status().code(), Code::kInvalidArgument);
}

// Landing zones (what a devmem receive lands in before the gatherer copies it on): GPU memory from
// the pool nearest the NIC and the gatherer's GPU by the P2PDMA rule, with real memory behind it,
// booked to its owner until released; refused with the reason where the nearest pool is another
// GPU's, where the NIC reaches no GPU, and where pools keep books only.
TEST(Placement, LandingZonesComeFromTheGpuPoolNearestTheNicAndGpu) {
  auto arenas = std::make_shared<std::vector<std::unique_ptr<std::vector<unsigned char>>>>();
  DeviceMemory hook{[arenas](int, uint64_t bytes) -> Result<void*> {
                      arenas->push_back(std::make_unique<std::vector<unsigned char>>(bytes));
                      return static_cast<void*>(arenas->back()->data());
                    },
                    [](int, void*, uint64_t) {}};
  auto t = shared("dual-socket-icelake");
  auto p = Placement::create(t, std::make_shared<P2pmemDouble>(), hook, 32 << 20);
  // ens2 (84:00.0) shares socket 1's switch with cuda:1 (83:00.0); ens1 (04:00.0) socket 0's with cuda:0.
  auto z1 = p->allocate_nic_memory("ens2", 1, 16 << 20, "devmem landing zone of ens2");
  ASSERT_TRUE(z1.ok()) << z1.status().to_string();
  EXPECT_EQ(z1->pool(), "cuda:1 (0000:83:00.0)");
  EXPECT_EQ(z1->cuda_device(), 1);
  ASSERT_NE(z1->data(), nullptr);
  auto z0 = p->allocate_nic_memory("ens1", 0, 16 << 20, "devmem landing zone of ens1");
  ASSERT_TRUE(z0.ok()) << z0.status().to_string();
  EXPECT_EQ(z0->pool(), "cuda:0 (0000:03:00.0)");
  EXPECT_NE(z0->data(), z1->data());
  auto data = random_bytes(16 << 20);
  std::memcpy(z1->data(), data.data(), data.size());
  EXPECT_EQ(std::memcmp(z1->data(), data.data(), data.size()), 0);
  std::vector<PoolUsage> books = p->usage();
  EXPECT_EQ(pool_named(books, "cuda:1")->owners.at("devmem landing zone of ens2"), 16u << 20);
  EXPECT_EQ(pool_named(books, "cuda:0")->owners.at("devmem landing zone of ens1"), 16u << 20);
  // A gatherer on cuda:0 behind ens2: both pools cross the sockets once, and the tie goes to the
  // pool published first, cuda:0's, which its gatherer writes.
  auto cross = p->allocate_nic_memory("ens2", 0, 4096, "cross");
  ASSERT_TRUE(cross.ok()) << cross.status().to_string();
  EXPECT_EQ(cross->pool(), "cuda:0 (0000:03:00.0)");
  cross->reset();
  // Unknown NIC or GPU, a virtual interface.
  EXPECT_EQ(p->allocate_nic_memory("ens9", 0, 4096, "x").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(p->allocate_nic_memory("lo", 0, 4096, "x").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(p->allocate_nic_memory("ens1", 7, 4096, "x").status().code(), Code::kInvalidArgument);
  z1->reset();
  z0->reset();
  for (const auto& u : p->usage()) EXPECT_EQ(u.used, 0u) << u.desc.name;

  // The GPU machine: the NIC reaches no GPU (host bridge 0d57 not whitelisted).
  auto h200 = Placement::create(shared("gpu-h200x2"), std::make_shared<P2pmemDouble>(), hook);
  auto none = h200->allocate_nic_memory("eth0", 0, 4096, "devmem landing zone of eth0");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Code::kResourceExhausted);
  EXPECT_NE(none.status().message().find("cannot reach 0000:00:03.0"), std::string::npos) << none.status().message();
  // Books only (no CUDA): no memory to land in.
  auto books_only = Placement::create(t, std::make_shared<P2pmemDouble>());
  auto nomem = books_only->allocate_nic_memory("ens2", 1, 4096, "x");
  ASSERT_FALSE(nomem.ok());
  EXPECT_EQ(nomem.status().code(), Code::kUnavailable);
  EXPECT_NE(nomem.status().message().find("books only"), std::string::npos) << nomem.status().message();
}

// TCP staging for each GPU goes to the pinned pool of its socket, booked to its owner until given back.
TEST(Placement, StagingTakesTheHostPoolNearestTheGpu) {
  auto t = shared("dual-socket-icelake");
  auto p = Placement::create(t, std::make_shared<P2pmemDouble>());
  Allocation a0, a1;
  EXPECT_EQ(p->stage(0, 1 << 20, "ctx for cuda:0", &a0), 0);
  EXPECT_EQ(p->stage(1, 1 << 20, "ctx for cuda:1", &a1), 1);
  EXPECT_EQ(pool_named(p->usage(), "pinned:node1")->owners.at("ctx for cuda:1"), 1u << 20);
  p->unstage(a0);
  p->unstage(a1);
  for (const auto& u : p->usage()) EXPECT_EQ(u.used, 0u) << u.desc.name;
}

// p2pmem from the NVMe's published BAR for a GPU and a NIC, through the kernel's allocate file: the
// bytes are usable, the kernel's pool and dmx's books both shrink, and both come back on release.
TEST(P2pmem, AllocatesFromTheNearestPublishedBarThroughTheKernel) {
  auto t = shared("dual-socket-icelake");
  auto kernel = std::make_shared<P2pmemDouble>();
  std::string file = allocate_file(*t, "0000:05:00.0");
  kernel->add_device(file, 16 << 20);
  auto p = Placement::create(t, kernel);
  std::string clients[] = {"0000:03:00.0", "0000:04:00.0"};
  auto b = p->allocate_p2pmem(clients, 5000, "rdma mlx5_0");
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  EXPECT_EQ(b->size(), (5000 + page - 1) / page * page);
  EXPECT_EQ(b->provider(), "0000:05:00.0");
  EXPECT_EQ(b->distance(), 12);  // 6 + 6 through the host bridge
  auto data = random_bytes(b->size());
  std::memcpy(b->data(), data.data(), data.size());
  EXPECT_EQ(std::memcmp(b->data(), data.data(), data.size()), 0);
  EXPECT_EQ(kernel->available(file), (16u << 20) - b->size());
  std::vector<PoolUsage> books = p->usage();
  const PoolUsage* bar = pool_named(books, "0000:05:00.0 p2pmem");
  ASSERT_NE(bar, nullptr);
  EXPECT_EQ(bar->owners.at("rdma mlx5_0"), b->size());
  P2pmemBuffer moved = std::move(*b);
  EXPECT_FALSE(*b);
  moved.reset();
  EXPECT_EQ(kernel->available(file), 16u << 20);
  EXPECT_EQ(kernel->live_mappings(), 0u);
  EXPECT_EQ(kernel->bad_unmaps(), 0);
  EXPECT_EQ(pool_named(p->usage(), "0000:05:00.0 p2pmem")->used, 0u);
}

// What the kernel refuses comes back with its errno and the right code, and leaves no booking.
TEST(P2pmem, KernelRefusalsCarryTheErrnoAndLeaveNoBooking) {
  auto t = shared("dual-socket-icelake");
  std::string file = allocate_file(*t, "0000:05:00.0");
  std::string clients[] = {"0000:03:00.0"};
  struct Case {
    const char* what;
    std::function<void(P2pmemDouble&)> setup;
    Code code;
    const char* text;
  };
  for (const Case& c : {Case{"kernel before 6.2", [](P2pmemDouble&) {}, Code::kUnavailable, "No such file"},
                        Case{"not root", [&](P2pmemDouble& k) { k.add_device(file, 16 << 20), k.deny(file); },
                             Code::kUnavailable, "Permission denied"},
                        Case{"device going away", [&](P2pmemDouble& k) { k.add_device(file, 16 << 20), k.remove(file); },
                             Code::kUnavailable, "No such device"},
                        Case{"another process took it",
                             [&](P2pmemDouble& k) { k.add_device(file, 16 << 20), k.take(file, (16 << 20) - 4096); },
                             Code::kResourceExhausted, "Cannot allocate memory"}}) {
    SCOPED_TRACE(c.what);
    auto kernel = std::make_shared<P2pmemDouble>();
    c.setup(*kernel);
    auto p = Placement::create(t, kernel);
    auto b = p->allocate_p2pmem(clients, 3 * 4096, "rdma");
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), c.code) << b.status().to_string();
    EXPECT_NE(b.status().message().find(c.text), std::string::npos) << b.status().message();
    EXPECT_NE(b.status().message().find(file), std::string::npos) << b.status().message();
    for (const auto& u : p->usage()) EXPECT_EQ(u.used, 0u) << u.desc.name;
  }
  // More than the BAR has, an unknown client, zero bytes, a machine without p2pmem.
  auto kernel = std::make_shared<P2pmemDouble>();
  kernel->add_device(file, 16 << 20);
  auto p = Placement::create(t, kernel);
  EXPECT_EQ(p->allocate_p2pmem(clients, 17 << 20, "x").status().code(), Code::kResourceExhausted);
  std::string unknown[] = {"0000:77:00.0"};
  EXPECT_EQ(p->allocate_p2pmem(unknown, 4096, "x").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(p->allocate_p2pmem(clients, 0, "x").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(p->allocate_p2pmem(clients, UINT64_MAX, "x").status().code(), Code::kInvalidArgument);
  auto vm = Placement::create(shared("gpu-h200x2"), kernel);
  std::string gpu[] = {"0000:00:06.0"};
  auto none = vm->allocate_p2pmem(gpu, 4096, "x");
  EXPECT_EQ(none.status().code(), Code::kResourceExhausted);
  EXPECT_NE(none.status().message().find("no pools"), std::string::npos) << none.status().message();
}

// The double answers as the kernel's p2pmem_alloc_mmap does for what dmx never asks.
TEST(P2pmem, DoubleRefusesPrivateMappingsAndOffsetsAsTheKernelDoes) {
  P2pmemDouble k;
  k.add_device("/x/p2pmem/allocate", 1 << 20);
  EXPECT_EQ(k.map("/x/p2pmem/allocate", 4096, /*shared=*/false, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(k.map("/x/p2pmem/allocate", 4096, true, 4096).status().code(), Code::kInvalidArgument);
  auto ok = k.map("/x/p2pmem/allocate", 4096, true, 0);
  ASSERT_TRUE(ok.ok());
  k.unmap(*ok, 4096);
  EXPECT_EQ(k.available("/x/p2pmem/allocate"), 1u << 20);
}

// The real kernel seam, where the file is absent: the errno and the version it needs.
TEST(P2pmem, RealKernelSaysWhatIsMissing) {
  auto r = kernel_p2pmem()->map("/nonexistent-dmx/p2pmem/allocate", 4096, true, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_NE(r.status().message().find("Linux 6.2"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace dmx::topo
