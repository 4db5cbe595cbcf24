#include "topo/placement.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <map>

#include <fmt/format.h>

#include "core/log.h"

namespace dmx::topo {

P2pmemBuffer& P2pmemBuffer::operator=(P2pmemBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = std::move(o.owner_);
    booking_ = o.booking_;
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    provider_ = std::move(o.provider_);
    distance_ = o.distance_;
  }
  return *this;
}

void P2pmemBuffer::reset() {
  if (owner_) {
    if (data_ != nullptr) owner_->kernel_->unmap(data_, size_);
    owner_->give_back(booking_);
  }
  owner_.reset();
  data_ = nullptr;
  size_ = 0;
}

GpuBuffer& GpuBuffer::operator=(GpuBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = std::move(o.owner_);
    booking_ = std::exchange(o.booking_, Allocation{});
    data_ = std::exchange(o.data_, nullptr);
    cuda_device_ = o.cuda_device_;
    pool_ = std::move(o.pool_);
  }
  return *this;
}

void GpuBuffer::reset() {
  if (owner_) owner_->give_back(booking_);
  owner_.reset();
  booking_ = Allocation{};
  data_ = nullptr;
}

Placement::Placement(std::shared_ptr<const Topology> topo, std::shared_ptr<P2pmemKernel> kernel,
                     DeviceMemory gpu_memory, uint64_t gpu_pool_bytes)
    : topo_(std::move(topo)),
      kernel_(std::move(kernel)),
      orch_(topo_),
      gpu_pool_bytes_(gpu_pool_bytes),
      gpu_memory_(std::move(gpu_memory)) {}

Placement::~Placement() {
  for (auto& [id, a] : arenas_)
    if (a.base != nullptr && gpu_memory_.free) gpu_memory_.free(a.ordinal, a.base, a.bytes);
}

std::shared_ptr<Placement> Placement::create(std::shared_ptr<const Topology> topo,
                                             std::shared_ptr<P2pmemKernel> kernel, DeviceMemory gpu_memory,
                                             uint64_t gpu_pool_bytes) {
  std::shared_ptr<Placement> p(
      new Placement(std::move(topo), std::move(kernel), std::move(gpu_memory), gpu_pool_bytes));
  p->publish_all();
  return p;
}

void Placement::publish_all() {
  const Topology& t = *topo_;
  for (const auto& node : t.numa) {
    uint64_t capacity = std::max<uint64_t>(node.mem_total_kib * 1024 / 2, uint64_t{1} << 30);
    (void)orch_.publish({fmt::format("pinned:node{}", node.id), PoolKind::kPinnedHost, -1, node.id, capacity, nullptr});
  }
  for (size_t i = 0; i < t.gpus.size(); ++i) {
    int dev = t.gpus[i];
    int ordinal = t.cuda_ordinal(dev);
    if (ordinal < 0 && t.cuda.devices.empty()) ordinal = static_cast<int>(i);  // no overlay: CUDA's PCI order
    std::string name = ordinal >= 0 ? fmt::format("cuda:{} ({})", ordinal, t.devices[dev].addr.to_string())
                                    : fmt::format("gpu {}", t.devices[dev].addr.to_string());
    auto id = orch_.publish({name, PoolKind::kGpu, dev, t.devices[dev].numa_node, gpu_pool_bytes_, nullptr});
    if (id.ok()) arenas_[*id] = GpuArena{ordinal, gpu_pool_bytes_, nullptr, {}};
  }
  for (size_t i = 0; i < t.devices.size(); ++i) {
    const PciDevice& d = t.devices[i];
    if (!d.p2pmem.present || !d.p2pmem.published) continue;
    uint64_t capacity = d.p2pmem.available;  // what the kernel has left; others may take more
    if (capacity == 0) continue;
    auto id = orch_.publish({d.addr.to_string() + " p2pmem", PoolKind::kDeviceBar, static_cast<int>(i), d.numa_node,
                             capacity, nullptr});
    if (id.ok()) bar_paths_[*id] = t.root + "/" + d.path + "/p2pmem/allocate";
  }
}

Result<std::vector<int>> Placement::resolve(std::span<const std::string> clients) const {
  std::vector<int> out;
  if (clients.empty()) return Status(Code::kInvalidArgument, "no client devices named");
  for (const std::string& c : clients) {
    int i = topo_->find(c);
    if (i < 0)
      return Status(Code::kInvalidArgument, fmt::format("client device {} is not in the topology of {}", c, topo_->root));
    out.push_back(i);
  }
  return out;
}

void Placement::give_back(const Allocation& a) {
  if (a.size == 0) return;
  GpuArena extent;
  DeviceMemory mem;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = arenas_.find(a.pool); it != arenas_.end() && it->second.extent) {
      extent = it->second;
      arenas_.erase(it);
      mem = gpu_memory_;
    }
  }
  // An extent's one booking: unpublished first, so that nobody takes it once freed (it is then
  // forgotten), and its memory goes back to the GPU.
  if (extent.extent) (void)orch_.unpublish(a.pool);
  if (Status s = orch_.free(a); !s.ok()) DMX_LOG_ERROR("placement: {}", s.to_string());
  if (extent.base != nullptr && mem.free) mem.free(extent.ordinal, extent.base, extent.bytes);
}

int Placement::stage(int cuda_device, uint64_t bytes, const std::string& owner, Allocation* booked) {
  *booked = Allocation{};
  auto a = orch_.allocate_staging(cuda_device, bytes, owner);
  if (!a.ok()) {
    DMX_LOG_DEBUG("staging placement for {}: {}", owner, a.status().message());
    return -1;
  }
  *booked = *a;
  for (const auto& u : orch_.usage())
    if (u.id == a->pool) return u.desc.numa_node;
  return -1;
}

namespace {

uint64_t page_size() {
  long p = ::sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<uint64_t>(p) : 4096;
}

}  // namespace

Result<P2pmemBuffer> Placement::allocate_p2pmem(std::span<const std::string> clients, uint64_t bytes,
                                                std::string owner) {
  if (bytes == 0) return Status(Code::kInvalidArgument, "allocate_p2pmem: zero bytes");
  const uint64_t page = page_size();
  if (bytes > UINT64_MAX - page) return Status(Code::kInvalidArgument, fmt::format("allocate_p2pmem: {} bytes", bytes));
  const uint64_t len = (bytes + page - 1) / page * page;
  DMX_ASSIGN_OR_RETURN(std::vector<int> idx, resolve(clients));
  DMX_ASSIGN_OR_RETURN(std::vector<Candidate> cands, orch_.find_many(idx, len, kind_bit(PoolKind::kDeviceBar)));
  if (cands.empty()) {
    // Let the orchestrator say why each BAR was refused.
    auto a = orch_.allocate(idx, len, owner, kind_bit(PoolKind::kDeviceBar));
    if (a.ok()) give_back(*a);
    return Status(Code::kResourceExhausted,
                  fmt::format("p2pmem for {}: {}", owner, a.ok() ? "no published p2pmem BAR" : a.status().message()));
  }
  std::string tried;
  bool exhausted = false;
  Code last = Code::kUnavailable;
  for (const Candidate& c : cands) {
    std::string path;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = bar_paths_.find(c.pool);
      if (it == bar_paths_.end()) continue;
      path = it->second;
    }
    auto booking = orch_.allocate_from(c.pool, len, owner);
    if (!booking.ok()) {
      tried += fmt::format("; {}", booking.status().message());
      exhausted = exhausted || booking.status().code() == Code::kResourceExhausted;
      continue;
    }
    auto mapped = kernel_->map(path, len, /*shared=*/true, 0);
    if (!mapped.ok()) {
      give_back(*booking);
      tried += fmt::format("; {}", mapped.status().message());
      last = mapped.status().code();
      exhausted = exhausted || last == Code::kResourceExhausted;
      continue;
    }
    P2pmemBuffer b;
    b.owner_ = shared_from_this();
    b.booking_ = *booking;
    b.data_ = *mapped;
    b.size_ = len;
    for (const auto& u : orch_.usage())
      if (u.id == c.pool) b.provider_ = topo_->devices[static_cast<size_t>(u.desc.pci)].addr.to_string();
    b.distance_ = c.total_distance;
    return b;
  }
  return Status(exhausted ? Code::kResourceExhausted : last,
                fmt::format("p2pmem of {} bytes for {}: every reachable BAR refused{}", len, owner, tried));
}

Result<GpuBuffer> Placement::allocate_gpu(std::span<const std::string> clients, uint64_t bytes, std::string owner,
                                          GpuRequest how) {
  if (bytes == 0) return Status(Code::kInvalidArgument, "allocate_gpu: zero bytes");
  DMX_ASSIGN_OR_RETURN(std::vector<int> idx, resolve(clients));
  if (!how.grow && how.align == Orchestrator::kAlign) {
    DMX_ASSIGN_OR_RETURN(Allocation a, orch_.allocate(idx, bytes, owner, kind_bit(PoolKind::kGpu)));
    return back(a, owner, how.align);
  }
  // Every GPU pool the clients reach, nearest first, room or not.
  DMX_ASSIGN_OR_RETURN(std::vector<Candidate> cands, orch_.find_many(idx, 0, kind_bit(PoolKind::kGpu)));
  std::map<PoolId, int> pci;
  for (const auto& u : orch_.usage()) pci[u.id] = u.desc.pci;
  std::string refusals;
  for (const Candidate& c : cands) {
    if (how.grow && pci[c.pool] != pci[cands.front().pool]) continue;  // the nearest GPU only
    auto a = orch_.allocate_from(c.pool, bytes, owner, how.align);
    if (a.ok()) return back(*a, owner, how.align);
    refusals += "; " + a.status().message();
  }
  if (cands.empty()) {  // let the orchestrator say why each pool was refused
    auto a = orch_.allocate(idx, bytes, owner, kind_bit(PoolKind::kGpu));
    if (a.ok()) give_back(*a);
    return Status(Code::kResourceExhausted, fmt::format("GPU memory for {}: {}", owner,
                                                        a.ok() ? "no published GPU pool" : a.status().message()));
  }
  if (how.grow) return grow(pci[cands.front().pool], bytes, owner, how.align);
  return Status(Code::kResourceExhausted, fmt::format("GPU memory for {}: no pool has {} bytes at alignment {}{}", owner,
                                                      bytes, how.align, refusals));
}

// An extent of GPU `pci` for one request: its own pool and arena, forgotten when the request lets go.
Result<GpuBuffer> Placement::grow(int pci, uint64_t bytes, const std::string& owner, uint64_t align) {
  GpuArena base;
  std::string base_name;
  std::vector<PoolUsage> pools = orch_.usage();
  for (const auto& u : pools)
    if (u.desc.kind == PoolKind::kGpu && u.desc.pci == pci && base_name.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = arenas_.find(u.id); it != arenas_.end() && !it->second.extent) {
        base = it->second;
        base_name = u.desc.name;
      }
    }
  bool memory;
  {
    std::lock_guard<std::mutex> lock(mu_);
    memory = static_cast<bool>(gpu_memory_.allocate);
  }
  if (base_name.empty() || !memory || base.ordinal < 0)
    return Status(Code::kResourceExhausted,
                  fmt::format("GPU memory for {}: the GPU pool {} has no {} bytes free in one piece, and it cannot grow "
                              "({})",
                              owner, base_name.empty() ? topo_->devices[static_cast<size_t>(pci)].addr.to_string() : base_name,
                              bytes, !memory ? "it keeps books only: no CUDA here" : "not a CUDA device here"));
  const PciDevice& d = topo_->devices[static_cast<size_t>(pci)];
  uint64_t n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    n = ++extents_;
  }
  DMX_ASSIGN_OR_RETURN(Allocation a, orch_.publish_allocated({fmt::format("{} extent {}", base_name, n), PoolKind::kGpu,
                                                              pci, d.numa_node, 0, nullptr},
                                                             bytes, owner));
  {
    std::lock_guard<std::mutex> lock(mu_);
    arenas_[a.pool] = GpuArena{base.ordinal, a.size, nullptr, {}, /*extent=*/true};  // the extent is its booking
  }
  DMX_LOG_DEBUG("placement: GPU pool {} grows by an extent of {} bytes for {}", base_name, a.size, owner);
  return back(a, owner, align);
}

// A booking in a GPU pool, with the pool's memory behind it (the arena on its first use).
Result<GpuBuffer> Placement::back(Allocation a, const std::string& owner, uint64_t align) {
  GpuBuffer b;
  b.owner_ = shared_from_this();
  b.booking_ = a;
  GpuArena arena;
  DeviceMemory mem;
  {
    std::lock_guard<std::mutex> lock(mu_);
    arena = arenas_[a.pool];
    mem = gpu_memory_;
  }
  b.cuda_device_ = arena.ordinal;
  for (const auto& u : orch_.usage())
    if (u.id == a.pool) b.pool_ = u.desc.name;
  if (arena.base == nullptr && mem.allocate && arena.ordinal >= 0) {
    // The arena on first use, outside the lock (a device allocation synchronizes).
    auto base = mem.allocate(arena.ordinal, arena.bytes);
    std::lock_guard<std::mutex> lock(mu_);
    GpuArena& live = arenas_[a.pool];
    if (!base.ok()) {
      live.failed = base.status().message();
      return Status(Code::kUnavailable, fmt::format("GPU pool {} for {}: its {} bytes could not be allocated: {}",
                                                    b.pool_, owner, arena.bytes, live.failed));
    }
    if (live.base == nullptr) {
      live.base = *base;
      live.failed.clear();
    } else if (mem.free) {
      mem.free(arena.ordinal, *base, arena.bytes);  // another thread was first
    }
    arena = live;
  }
  if (arena.base != nullptr) b.data_ = static_cast<char*>(arena.base) + a.offset;
  // The offset is aligned; the address is where asked for more than the pool's own granule (the
  // arena's alignment is the allocator's: cudaMalloc's are 2 MiB for large ones).
  if (align > Orchestrator::kAlign && reinterpret_cast<uintptr_t>(b.data_) % align != 0)
    return Status(Code::kUnavailable, fmt::format("GPU pool {} for {}: its memory at {} is not aligned to {} bytes",
                                                  b.pool_, owner, b.data_, align));
  return b;
}

Result<GpuBuffer> Placement::allocate_nic_memory(const std::string& nic, int cuda_device, uint64_t bytes,
                                                 std::string owner, uint64_t align) {
  const Topology& t = *topo_;
  int n = t.nic_by_name(nic);
  if (n < 0 || t.nics[static_cast<size_t>(n)].pci < 0)
    return Status(Code::kInvalidArgument,
                  fmt::format("{}: {} is not a PCI network function of {}", owner, nic, t.root));
  int gpu = t.device_of_cuda(cuda_device);
  if (gpu < 0 && t.cuda.devices.empty() && cuda_device >= 0 && static_cast<size_t>(cuda_device) < t.gpus.size())
    gpu = t.gpus[static_cast<size_t>(cuda_device)];  // no overlay: CUDA's PCI order, as publish_all names them
  if (gpu < 0)
    return Status(Code::kInvalidArgument, fmt::format("{}: cuda:{} is not a GPU of {}", owner, cuda_device, t.root));
  std::string clients[] = {t.devices[static_cast<size_t>(t.nics[static_cast<size_t>(n)].pci)].addr.to_string(),
                           t.devices[static_cast<size_t>(gpu)].addr.to_string()};
  Result<GpuBuffer> got = allocate_gpu(clients, bytes, owner, GpuRequest{align, /*grow=*/true});
  if (!got.ok()) return Status(got.status().code(), fmt::format("{}: {}", owner, got.status().message()));
  GpuBuffer b = std::move(*got);
  if (b.cuda_device() != cuda_device)
    return Status(Code::kUnavailable,
                  fmt::format("{}: the GPU pool nearest {} and cuda:{} is {}, which the gatherer on cuda:{} cannot use",
                              owner, nic, cuda_device, b.pool(), cuda_device));
  if (b.data() == nullptr)
    return Status(Code::kUnavailable, fmt::format("{}: GPU pool {} keeps books only (no CUDA here)", owner, b.pool()));
  return b;
}

Result<std::shared_ptr<Placement>> Placement::for_root(const std::string& sysfs_root, DeviceMemory gpu_memory,
                                                       uint64_t gpu_pool_bytes) {
  static std::mutex* mu = new std::mutex();  // never destroyed: buffers may outlive static destruction
  static auto* live = new std::map<std::string, std::shared_ptr<Placement>>();
  std::lock_guard<std::mutex> lock(*mu);
  auto it = live->find(sysfs_root);
  if (it != live->end()) {
    std::shared_ptr<Placement> p = it->second;
    std::lock_guard<std::mutex> inner(p->mu_);
    if (!p->gpu_memory_.allocate && gpu_memory.allocate) p->gpu_memory_ = std::move(gpu_memory);
    return p;
  }
  auto topo = discover_local(sysfs_root);
  if (!topo.ok())
    return Status(Code::kUnavailable, fmt::format("topology of {} unknown: {}", sysfs_root, topo.status().message()));
  auto p = create(*topo, kernel_p2pmem(), std::move(gpu_memory), gpu_pool_bytes);
  (*live)[sysfs_root] = p;
  return p;
}

Result<P2pmemBuffer> allocate_p2pmem(const std::string& sysfs_root, std::span<const std::string> clients,
                                     uint64_t bytes, std::string owner) {
  DMX_ASSIGN_OR_RETURN(std::shared_ptr<Placement> p, Placement::for_root(sysfs_root));
  return p->allocate_p2pmem(clients, bytes, std::move(owner));
}

}  // namespace dmx::topo
