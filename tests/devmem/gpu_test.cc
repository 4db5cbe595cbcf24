// devmem on a GPU: dmabuf export of real GPU memory, binds with it on this machine's NICs, and the
// gather kernel on random fragment layouts. Names say "Gpu"; skipped without a CUDA device.
#include <gtest/gtest.h>
#include <net/if.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>

#include "cuda/gather.h"
#include "devmem/kernel_double.h"
#include "memory/backend.h"
#include "memory/dmabuf.h"
#include "topo/p2pmem_double.h"
#include "topo/placement.h"
#include "topo/topo_fixture.h"
#include "transport/devmem/kernel.h"
#include "transport/devmem/nic.h"
#include "transport/devmem/region.h"
#include "transport/devmem/rx.h"
#include "transport/devmem/tx_regions.h"
#include "transport/devmem/zcrx.h"
#include "test_env.h"

namespace dmx::devmem {
namespace {

struct DevMem {
  void* p = nullptr;
  size_t n = 0;
  explicit DevMem(size_t size) : n(size) {
    auto r = cuda::device_alloc(0, size);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (r.ok()) p = *r;
  }
  ~DevMem() { cuda::device_free(p); }
  MemRegion region() const { return MemRegion{p, n, {MemKind::kCuda, 0}}; }
};

TEST(Gpu, ExportDmabufOfGpuMemory) {
  DMX_SKIP_WITHOUT_GPU();
  DevMem mem(64 << 20);
  auto e = export_dmabuf(mem.region());
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_TRUE(e->fd.valid());
  EXPECT_GE(e->size, mem.n);
  std::error_code ec;
  auto link = std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(e->fd.get()), ec).string();
  std::printf("dmabuf fd %d -> %s, size %zu, offset %zu, %s mapping\n", e->fd.get(), link.c_str(), e->size, e->offset,
              e->pcie_mapping ? "PCIe BAR1" : "default");
  EXPECT_NE(link.find("dmabuf"), std::string::npos) << link;
}

// With a real GPU dmabuf, what each NIC of this machine answers. On virtio_net (the GPU machine
// here) bind-rx must be EOPNOTSUPP and bind-tx EOPNOTSUPP with "Driver does not support netmem TX".
TEST(Gpu, BindRealGpuDmabufOnEveryNic) {
  DMX_SKIP_WITHOUT_GPU();
  auto ops = make_kernel_netlink_ops();
  if (!ops->detect().family) DMX_SKIP(::dmx::test::kOldKernel) << "no netdev genl family: " << ops->detect().detail;
  DevMem mem(16 << 20);
  for (const auto& e : std::filesystem::directory_iterator("/sys/class/net")) {
    std::string name = e.path().filename();
    int ifindex = static_cast<int>(::if_nametoindex(name.c_str()));
    uint32_t q[] = {0};
    auto rx = BoundRegion::bind_rx(*ops, ifindex, q, mem.region());
    auto tx = BoundRegion::bind_tx(*ops, ifindex, mem.region());
    std::string drv = driver_name(name);
    std::printf("%s (%s):\n  bind-rx: %s\n  bind-tx: %s\n", name.c_str(), drv.c_str(),
                rx.ok() ? "BOUND" : rx.status().message().c_str(), tx.ok() ? "BOUND" : tx.status().message().c_str());
    if (drv == "virtio_net" || name == "lo") {
      ASSERT_FALSE(rx.ok());
      EXPECT_NE(rx.status().message().find("errno 95"), std::string::npos);
      ASSERT_FALSE(tx.ok());
      EXPECT_NE(tx.status().message().find("errno 95"), std::string::npos);
      EXPECT_NE(tx.status().message().find("Driver does not support netmem TX"), std::string::npos);
    }
  }
}

struct Layout {
  const char* name;
  bool aligned;     // 4 KiB fragments at page offsets
  uint32_t max_len;
  bool odd_dst;     // destination base not 16-byte aligned
};

TEST(Gpu, GatherKernelMatchesHostOnRandomLayouts) {
  DMX_SKIP_WITHOUT_GPU();
  const size_t pool_size = 64 << 20;
  DevMem pool(pool_size);
  std::vector<uint8_t> host_pool(pool_size);
  std::mt19937_64 rng(2026);
  for (auto& b : host_pool) b = static_cast<uint8_t>(rng());
  ASSERT_TRUE(cuda::copy_to_device(pool.p, host_pool.data(), pool_size).ok());
  auto q = cuda::GatherQueue::create(0);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  for (Layout l : {Layout{"aligned-4k", true, 4096, false}, Layout{"random-1..4096", false, 4096, false},
                   Layout{"mss-1448", false, 1448, false}, Layout{"random-odd-dst", false, 4096, true},
                   Layout{"tiny-1..64", false, 64, false}}) {
    std::vector<cuda::GatherDesc> d;
    uint64_t dst = l.odd_dst ? 3 : 0;
    std::uniform_int_distribution<uint32_t> len_d(1, l.max_len);
    std::uniform_int_distribution<uint64_t> page_d(0, pool_size / 4096 - 1);
    while (dst < (24u << 20)) {
      uint32_t len = l.aligned ? 4096 : (l.max_len == 1448 ? 1448 : len_d(rng));
      uint64_t page = page_d(rng) * 4096;
      uint64_t off = l.aligned ? 0 : rng() % (4096 - std::min<uint32_t>(len, 4096) + 1);
      d.push_back({page + off, dst, len, 0});
      dst += len;
    }
    DevMem out(dst + 64);
    ASSERT_TRUE(cuda::device_memset(out.p, 0x5A, out.n).ok());
    auto f = (*q)->enqueue(pool.p, pool_size, out.p, out.n, d, {});
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    ASSERT_TRUE((*q)->wait(*f, Deadline::after(std::chrono::seconds(30))).ok()) << l.name;
    std::vector<uint8_t> got(out.n), want(out.n, 0x5A);
    for (const auto& g : d) std::memcpy(want.data() + g.dst, host_pool.data() + g.src, g.len);
    ASSERT_TRUE(cuda::copy_to_host(got.data(), out.p, out.n).ok());
    EXPECT_TRUE(got == want) << l.name;
    std::printf("%-16s %zu fragments, %lu bytes: ok\n", l.name, d.size(), static_cast<unsigned long>(dst));
  }
}

TEST(Gpu, GatherKernelRejectsOutOfBoundsDescriptors) {
  DMX_SKIP_WITHOUT_GPU();
  DevMem pool(1 << 20), out(1 << 20);
  ASSERT_TRUE(cuda::device_memset(out.p, 0, out.n).ok());
  auto q = cuda::GatherQueue::create(0);
  ASSERT_TRUE(q.ok());
  std::vector<cuda::GatherDesc> d = {{0, 0, 4096, 0},
                                     {(1 << 20) - 100, 4096, 4096, 0},   // past the source
                                     {0, (1 << 20) - 10, 4096, 0},       // past the destination
                                     {~0ull - 10, 0, 4096, 0}};          // would overflow
  auto f = (*q)->enqueue(pool.p, pool.n, out.p, out.n, d, {});
  ASSERT_TRUE(f.ok());
  Status s = (*q)->wait(*f, Deadline::after(std::chrono::seconds(10)));
  EXPECT_EQ(s.code(), Code::kOutOfRange) << s.to_string();
  EXPECT_NE(s.message().find("3 out-of-bounds"), std::string::npos) << s.message();
}

// The whole receive path with the GPU gather: fragments and linear chunks from the double,
// pool in GPU memory, destination in GPU memory.
TEST(Gpu, DevmemRxWithGpuGatherThroughTheDouble) {
  DMX_SKIP_WITHOUT_GPU();
  testing::KernelDouble k(48 << 20, 5, 77);
  std::vector<uint8_t> data(12 << 20);
  std::mt19937_64 rng(9);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  ASSERT_TRUE(k.inject(data, testing::RxLayout{1448, 0.1, 4096, false}));
  DevMem pool(k.pool_size()), dst(data.size());
  ASSERT_TRUE(cuda::copy_to_device(pool.p, k.pool(), k.pool_size()).ok());  // the NIC's writes
  auto g = make_cuda_gatherer(0);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  auto rx = DevmemRx::create(&k, RxPool{5, 0, pool.region()}, g->get(), RxOptions{});
  ASSERT_TRUE(rx.ok());
  ASSERT_TRUE((*rx)->receive(dst.region(), Deadline::after(std::chrono::seconds(30))).ok()) << (*rx)->error().to_string();
  std::vector<uint8_t> got(data.size());
  ASSERT_TRUE(cuda::copy_to_host(got.data(), dst.p, got.size()).ok());
  EXPECT_TRUE(got == data);
  EXPECT_EQ(k.user_tokens(), 0u);
  EXPECT_GT((*rx)->stats().linear_bytes, 0u);
  std::printf("gpu rx: %lu frags, %lu devmem bytes, %lu linear bytes, %lu DONTNEED calls\n",
              static_cast<unsigned long>((*rx)->stats().frags), static_cast<unsigned long>((*rx)->stats().devmem_bytes),
              static_cast<unsigned long>((*rx)->stats().linear_bytes),
              static_cast<unsigned long>((*rx)->stats().tokens.calls));
}

// A devmem landing zone from a GPU pool with real CUDA memory behind it (the hook kernel_seams
// gives the placement): on the dual-socket-icelake fixture, ens1 sits beside 0000:03:00.0, which
// the placement names cuda:0 (PCI order), so the zone is this machine's GPU 0; it holds what is
// copied into it and its booking goes when it is let go.
TEST(Gpu, LandingZoneFromAGpuPoolHoldsWhatIsCopiedIn) {
  DMX_SKIP_WITHOUT_GPU();
  topo::DeviceMemory cuda_hook{[](int ordinal, uint64_t bytes) -> Result<void*> {
                                 DMX_ASSIGN_OR_RETURN(MemoryBackend * b, backend_for(MemSpec{MemKind::kCuda, ordinal}));
                                 return b->allocate(bytes);
                               },
                               [](int ordinal, void* p, uint64_t bytes) {
                                 if (auto b = backend_for(MemSpec{MemKind::kCuda, ordinal}); b.ok()) (*b)->free(p, bytes);
                               }};
  auto placement = topo::Placement::create(
      std::make_shared<const topo::Topology>(topo::testing::load("dual-socket-icelake")),
      std::make_shared<topo::testing::P2pmemDouble>(), cuda_hook, 64 << 20);
  auto z = placement_memory([&]() -> Result<std::shared_ptr<topo::Placement>> { return placement; }, "ens1", 0,
                            MemSpec{MemKind::kCuda, 0})(MemoryUse::kLanding, 16 << 20, "peer:1");
  ASSERT_TRUE(z.ok()) << z.status().to_string();
  EXPECT_EQ(z->region.where, (MemSpec{MemKind::kCuda, 0}));
  std::vector<uint8_t> data(z->region.size - 5), got(data.size());
  std::mt19937_64 rng(std::random_device{}());
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  ASSERT_TRUE(cuda::copy_to_device(static_cast<char*>(z->region.ptr) + 5, data.data(), data.size()).ok());
  ASSERT_TRUE(cuda::copy_to_host(got.data(), static_cast<char*>(z->region.ptr) + 5, got.size()).ok());
  EXPECT_TRUE(got == data);
  std::printf("landing zone: %s\n", z->where.c_str());
  z->keep.reset();
  for (const auto& u : placement->usage()) EXPECT_EQ(u.used, 0u) << u.desc.name;
}

// devmem's RX pool (256 MiB: the 64 MiB GPU pool grows by an extent) and TX ring from a GPU pool
// with real CUDA memory: each is exported as a dma-buf of exactly its own pages (offset 0, its
// size: what bind-rx and zcrx need), and the extent's memory goes back when it is let go.
TEST(Gpu, DevmemPoolAndRingFromAGpuPoolExportAsWholePages) {
  DMX_SKIP_WITHOUT_GPU();
  int allocations = 0, frees = 0;
  topo::DeviceMemory cuda_hook{[&](int ordinal, uint64_t bytes) -> Result<void*> {
                                 ++allocations;
                                 DMX_ASSIGN_OR_RETURN(MemoryBackend * b, backend_for(MemSpec{MemKind::kCuda, ordinal}));
                                 return b->allocate(bytes);
                               },
                               [&](int ordinal, void* p, uint64_t bytes) {
                                 ++frees;
                                 if (auto b = backend_for(MemSpec{MemKind::kCuda, ordinal}); b.ok()) (*b)->free(p, bytes);
                               }};
  {
    auto placement = topo::Placement::create(
        std::make_shared<const topo::Topology>(topo::testing::load("dual-socket-icelake")),
        std::make_shared<topo::testing::P2pmemDouble>(), cuda_hook, 64 << 20);
    auto place = placement_memory([&]() -> Result<std::shared_ptr<topo::Placement>> { return placement; }, "ens1", 0,
                                  MemSpec{MemKind::kCuda, 0});
    auto landing = place(MemoryUse::kLanding, (16 << 20) + 100, "peer:1");  // leaves the pool unaligned
    ASSERT_TRUE(landing.ok()) << landing.status().to_string();
    auto ring = place(MemoryUse::kTxRing, 32 << 20, "peer:1");
    auto pool = place(MemoryUse::kRxPool, 256 << 20, "");
    ASSERT_TRUE(ring.ok()) << ring.status().to_string();
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    EXPECT_NE(pool->where.find("extent"), std::string::npos) << pool->where;
    for (const PlacedMemory* m : {&*ring, &*pool}) {
      auto e = export_dmabuf(m->region);
      ASSERT_TRUE(e.ok()) << m->where << ": " << e.status().to_string();
      EXPECT_EQ(e->offset, 0u) << m->where;
      EXPECT_EQ(e->size, m->region.size) << m->where;
    }
    std::printf("RX pool: %s\nTX ring: %s\n", pool->where.c_str(), ring->where.c_str());
    EXPECT_EQ(allocations, 2) << "the pool's arena and the extent";
    pool->keep.reset();
    EXPECT_EQ(frees, 1) << "the extent goes back with the RX pool";
  }
  EXPECT_EQ(frees, 2);
}

// TX per registered region with real GPU memory: the region is exported and bound with bind-tx
// on a real NIC; where the NIC cannot (virtio_net: no netmem TX), the kernel's words are cached
// with the region and are the reason its sends go through the ring.
TEST(Gpu, DevmemTxRegionOfGpuMemoryBindsOrGivesTheKernelsReason) {
  DMX_SKIP_WITHOUT_GPU();
  DevMem mem(8 << 20);
  auto region = register_tx_region(mem.region());
  ASSERT_TRUE(find_tx_region(mem.region().sub(4096, 1 << 20)) == region);
  for (const auto& e : std::filesystem::directory_iterator("/sys/class/net")) {
    std::string ifname = e.path().filename();
    if (ifname == "lo") continue;
    HostSeams seams;
    seams.netlink = make_kernel_netlink_ops();
    if (!seams.netlink->detect().bind_tx) DMX_SKIP(::dmx::test::kOldKernel) << "no bind-tx op (Linux < 6.16)";
    seams.exporter = export_dmabuf;
    seams.ifname = ifname;
    seams.ifindex = static_cast<int>(::if_nametoindex(ifname.c_str()));
    auto b = region->bound_for(seams);
    std::printf("%s: %s\n", ifname.c_str(), b.ok() ? "bound for TX" : b.status().message().c_str());
    if (!b.ok()) {
      EXPECT_NE(b.status().message().find("bind-tx of the registered region"), std::string::npos);
      EXPECT_NE(b.status().message().find("(errno "), std::string::npos) << b.status().message();
      auto again = region->bound_for(seams);  // cached: the same reason, no second attempt
      EXPECT_EQ(again.status().message(), b.status().message());
    }
  }
}

// zcrx with a real GPU dma-buf area on this machine's NICs: registered (a capable NIC) or the
// kernel's refusal with what it means.
TEST(Gpu, ZcrxRegistrationWithAGpuDmabufAreaOnEveryNic) {
  DMX_SKIP_WITHOUT_GPU();
  if (running_kernel_before(6, 16)) DMX_SKIP(::dmx::test::kOldKernel) << "zcrx dma-buf areas need Linux 6.16";
  DevMem mem(4 << 20);
  auto e = export_dmabuf(mem.region());
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  for (const auto& d : std::filesystem::directory_iterator("/sys/class/net")) {
    std::string ifname = d.path().filename();
    if (ifname == "lo") continue;
    auto k = open_kernel_zcrx(static_cast<int>(::if_nametoindex(ifname.c_str())), 0, -1, e->fd.get(), e->size, 256);
    std::printf("zcrx %s: %s\n", ifname.c_str(), k.ok() ? "registered (released)" : k.status().message().c_str());
    if (!k.ok()) {
      EXPECT_NE(k.status().message().find("IORING_REGISTER_ZCRX_IFQ"), std::string::npos) << k.status().message();
      EXPECT_NE(k.status().message().find("(errno "), std::string::npos) << k.status().message();
    }
  }
}

}  // namespace
}  // namespace dmx::devmem
