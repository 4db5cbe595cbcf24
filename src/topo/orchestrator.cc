#include "topo/orchestrator.h"

#include <fmt/format.h>

#include <algorithm>

namespace dmx::topo {

namespace {
constexpr int kUnknownNumaPenalty = 10;

// What every published pool must name: a device of the topology, unless it is host memory.
Status check_device(const Topology& topo, const PoolDesc& desc) {
  if (desc.kind != PoolKind::kPinnedHost && (desc.pci < 0 || desc.pci >= static_cast<int>(topo.devices.size())))
    return Status(Code::kInvalidArgument,
                  fmt::format("pool {}: device index {} is not in the topology", desc.name, desc.pci));
  return Status();
}

// Adds a pool with all of its capacity free; the caller holds the books' lock.
template <class Pools>
PoolId add_pool_locked(Pools& pools, PoolId& next_id, PoolDesc desc) {
  PoolId id = next_id++;
  typename Pools::mapped_type p;
  p.usage.id = id;
  p.usage.desc = std::move(desc);
  p.free_ranges[0] = p.usage.desc.capacity;
  pools.emplace(id, std::move(p));
  return id;
}
}  // namespace

std::string_view pool_kind_name(PoolKind k) {
  switch (k) {
    case PoolKind::kPinnedHost:
      return "pinned-host";
    case PoolKind::kGpu:
      return "gpu";
    case PoolKind::kDeviceBar:
      return "device-bar";
  }
  return "?";
}

Orchestrator::Orchestrator(std::shared_ptr<const Topology> topo) : topo_(std::move(topo)) {}

Result<PoolId> Orchestrator::publish(PoolDesc desc) {
  if (desc.capacity == 0) return Status(Code::kInvalidArgument, fmt::format("pool {}: capacity is zero", desc.name));
  DMX_RETURN_IF_ERROR(check_device(*topo_, desc));
  std::lock_guard lock(mu_);
  return add_pool_locked(pools_, next_id_, std::move(desc));
}

Result<Allocation> Orchestrator::publish_allocated(PoolDesc desc, uint64_t bytes, std::string owner) {
  if (bytes == 0 || bytes > UINT64_MAX - kAlign)
    return Status(Code::kInvalidArgument, fmt::format("pool {}: {} bytes", desc.name, bytes));
  desc.capacity = (bytes + kAlign - 1) / kAlign * kAlign;
  DMX_RETURN_IF_ERROR(check_device(*topo_, desc));
  std::lock_guard lock(mu_);  // published and taken under one lock: no other request sees it free
  PoolId id = add_pool_locked(pools_, next_id_, std::move(desc));
  return take_locked(id, bytes, std::move(owner), kAlign);
}

Status Orchestrator::unpublish(PoolId id) {
  std::lock_guard lock(mu_);
  auto it = pools_.find(id);
  if (it == pools_.end() || !it->second.usage.published)
    return Status(Code::kNotFound, fmt::format("pool {} is not published", id));
  if (it->second.usage.allocations == 0)
    pools_.erase(it);
  else
    it->second.usage.published = false;
  return Status();
}

int Orchestrator::distance_to(const Pool& p, std::span<const int> clients, std::string* why) const {
  const Topology& t = *topo_;
  if (p.usage.desc.kind == PoolKind::kPinnedHost) {
    int total = 0;
    int node = p.usage.desc.numa_node;
    int ni = t.numa_index(node);
    for (int c : clients) {
      int hops = static_cast<int>(t.chain(c).size());
      int cn = t.numa_of(c);
      int penalty = 0;
      if (node >= 0 && cn >= 0 && cn != node) {
        int ci = t.numa_index(cn);
        penalty = kUnknownNumaPenalty;
        if (ni >= 0 && ci >= 0 && ci < static_cast<int>(t.numa[ni].distances.size()) &&
            ni < static_cast<int>(t.numa[ni].distances.size()))
          penalty = std::max(1, t.numa[ni].distances[ci] - t.numa[ni].distances[ni]);
      }
      total += hops + penalty;
    }
    *why = fmt::format("host memory on node {}: {}", node, total);
    return total;
  }
  DistanceMany m = p2pdma_distance_many(t, p.usage.desc.pci, clients);
  if (m.total < 0) {
    for (size_t i = 0; i < m.per_client.size(); ++i)
      if (m.per_client[i].map == MapType::kNotSupported || m.per_client[i].map == MapType::kUnknown) {
        *why = fmt::format("{} cannot reach {}: {}", p.usage.desc.name, t.devices[clients[i]].addr.to_string(),
                           m.per_client[i].reason);
        break;
      }
    if (clients.empty()) *why = "no clients";
    return -1;
  }
  *why = fmt::format("{}: P2PDMA distance {}", p.usage.desc.name, m.total);
  return m.total;
}

std::vector<Candidate> Orchestrator::candidates_locked(std::span<const int> clients, uint64_t bytes,
                                                       PoolKinds kinds, std::string* refusals) const {
  std::vector<Candidate> out;
  for (const auto& [id, p] : pools_) {
    if (!p.usage.published || (kinds & kind_bit(p.usage.desc.kind)) == 0) continue;
    std::string why;
    int d = distance_to(p, clients, &why);
    if (d < 0) {
      if (refusals) *refusals += fmt::format("; {}", why);
      continue;
    }
    uint64_t largest = 0;
    for (const auto& [off, len] : p.free_ranges) largest = std::max(largest, len);
    if (largest < bytes) {
      if (refusals)
        *refusals += fmt::format("; {} has {} bytes free in one piece, {} asked", p.usage.desc.name, largest, bytes);
      continue;
    }
    out.push_back(Candidate{id, d, why});
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    return a.total_distance != b.total_distance ? a.total_distance < b.total_distance : a.pool < b.pool;
  });
  return out;
}

Result<std::vector<Candidate>> Orchestrator::find_many(std::span<const int> clients, uint64_t bytes,
                                                       PoolKinds kinds) const {
  for (int c : clients)
    if (c < 0 || c >= static_cast<int>(topo_->devices.size()))
      return Status(Code::kInvalidArgument, fmt::format("client device index {} is not in the topology", c));
  std::lock_guard lock(mu_);
  return candidates_locked(clients, bytes, kinds, nullptr);
}

Result<Allocation> Orchestrator::take_locked(PoolId id, uint64_t bytes, std::string owner, uint64_t align) {
  Pool& p = pools_.at(id);
  if (align < kAlign || (align & (align - 1)) != 0)
    return Status(Code::kInvalidArgument, fmt::format("allocate: alignment {} is not a power of two >= {}", align, kAlign));
  if (bytes > UINT64_MAX - align) return Status(Code::kInvalidArgument, fmt::format("allocate: {} bytes", bytes));
  uint64_t need = (bytes + kAlign - 1) / kAlign * kAlign;
  for (auto it = p.free_ranges.begin(); it != p.free_ranges.end(); ++it) {
    const uint64_t start = it->first, len = it->second;
    if (start > UINT64_MAX - align) continue;
    const uint64_t at = (start + align - 1) / align * align;
    const uint64_t skip = at - start;
    if (skip >= len) continue;
    const uint64_t room = len - skip;
    if (room < need && !(room >= bytes && start + len == p.usage.desc.capacity)) continue;
    uint64_t take = std::min(need, room);
    Allocation a{id, at, take, nullptr};
    if (p.usage.desc.base != nullptr) a.ptr = static_cast<char*>(p.usage.desc.base) + a.offset;
    p.free_ranges.erase(it);
    if (skip > 0) p.free_ranges[start] = skip;  // the front stays free
    if (room > take) p.free_ranges[at + take] = room - take;
    p.usage.used += take;
    p.usage.peak = std::max(p.usage.peak, p.usage.used);
    ++p.usage.allocations;
    ++p.usage.total_allocations;
    if (owner.empty()) owner = "unnamed";
    p.usage.owners[owner] += take;
    p.owner_at[a.offset] = std::move(owner);
    return a;
  }
  return Status(Code::kResourceExhausted,
                fmt::format("pool {} has no free range of {} bytes", p.usage.desc.name, bytes));
}

Result<Allocation> Orchestrator::allocate_from(PoolId id, uint64_t bytes, std::string owner, uint64_t align) {
  if (bytes == 0) return Status(Code::kInvalidArgument, "allocate: zero bytes");
  std::lock_guard lock(mu_);
  auto it = pools_.find(id);
  if (it == pools_.end() || !it->second.usage.published)
    return Status(Code::kNotFound, fmt::format("pool {} is not published", id));
  return take_locked(id, bytes, std::move(owner), align);
}

Result<Allocation> Orchestrator::allocate(std::span<const int> clients, uint64_t bytes, std::string owner,
                                          PoolKinds kinds) {
  if (bytes == 0) return Status(Code::kInvalidArgument, "allocate: zero bytes");
  for (int c : clients)
    if (c < 0 || c >= static_cast<int>(topo_->devices.size()))
      return Status(Code::kInvalidArgument, fmt::format("client device index {} is not in the topology", c));
  std::lock_guard lock(mu_);
  std::string refusals;
  std::vector<Candidate> c = candidates_locked(clients, bytes, kinds, &refusals);
  if (c.empty())
    return Status(Code::kResourceExhausted,
                  fmt::format("no published pool can serve {} bytes to these clients{}", bytes,
                              refusals.empty() ? std::string(" (no pools)") : refusals));
  return take_locked(c.front().pool, bytes, std::move(owner), kAlign);
}

Status Orchestrator::free(const Allocation& a) {
  std::lock_guard lock(mu_);
  auto it = pools_.find(a.pool);
  if (it == pools_.end()) return Status(Code::kNotFound, fmt::format("free: pool {} unknown", a.pool));
  Pool& p = it->second;
  if (a.size == 0 || a.offset + a.size > p.usage.desc.capacity || a.offset + a.size < a.offset)
    return Status(Code::kInvalidArgument,
                  fmt::format("free: range {}+{} outside pool {}", a.offset, a.size, p.usage.desc.name));
  // Refuse ranges that overlap free space: a double free is a caller bug we report, not absorb.
  auto next = p.free_ranges.lower_bound(a.offset);
  if (next != p.free_ranges.end() && next->first < a.offset + a.size)
    return Status(Code::kInvalidArgument,
                  fmt::format("free: {}+{} in pool {} is not allocated", a.offset, a.size, p.usage.desc.name));
  if (next != p.free_ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > a.offset)
      return Status(Code::kInvalidArgument,
                    fmt::format("free: {}+{} in pool {} is not allocated", a.offset, a.size, p.usage.desc.name));
  }
  uint64_t off = a.offset, len = a.size;
  if (next != p.free_ranges.end() && next->first == off + len) {
    len += next->second;
    next = p.free_ranges.erase(next);
  }
  if (next != p.free_ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      p.free_ranges.erase(prev);
    }
  }
  p.free_ranges[off] = len;
  p.usage.used -= std::min(p.usage.used, a.size);
  if (auto o = p.owner_at.find(a.offset); o != p.owner_at.end()) {
    auto held = p.usage.owners.find(o->second);
    if (held != p.usage.owners.end() && (held->second -= std::min(held->second, a.size)) == 0)
      p.usage.owners.erase(held);
    p.owner_at.erase(o);
  }
  if (p.usage.allocations > 0) --p.usage.allocations;
  if (!p.usage.published && p.usage.allocations == 0) pools_.erase(it);
  return Status();
}

int Orchestrator::numa_node_for_cuda_device(int cuda_device) const {
  int dev = topo_->device_of_cuda(cuda_device);
  if (dev < 0 && cuda_device >= 0 && cuda_device < static_cast<int>(topo_->gpus.size()) && topo_->cuda.devices.empty())
    dev = topo_->gpus[cuda_device];  // no CUDA overlay: assume CUDA's PCI bus order
  if (dev >= 0) return topo_->numa_of(dev);
  return topo_->numa.size() == 1 ? topo_->numa[0].id : -1;
}

Result<Allocation> Orchestrator::allocate_staging(int cuda_device, uint64_t bytes, std::string owner) {
  if (bytes == 0) return Status(Code::kInvalidArgument, "allocate_staging: zero bytes");
  int node = numa_node_for_cuda_device(cuda_device);
  int gpu = topo_->device_of_cuda(cuda_device);
  if (gpu < 0 && cuda_device >= 0 && cuda_device < static_cast<int>(topo_->gpus.size()) && topo_->cuda.devices.empty())
    gpu = topo_->gpus[cuda_device];
  std::lock_guard lock(mu_);
  std::vector<std::pair<int, PoolId>> order;  // (distance, id), nearest first; ties: published first
  if (gpu >= 0) {
    int one[] = {gpu};
    for (const Candidate& c : candidates_locked(one, bytes, kind_bit(PoolKind::kPinnedHost), nullptr))
      order.emplace_back(c.total_distance, c.pool);
  } else {
    // No device to measure from: same node first, then by SLIT distance.
    for (const auto& [id, p] : pools_) {
      if (!p.usage.published || p.usage.desc.kind != PoolKind::kPinnedHost) continue;
      int penalty = 0;
      if (node >= 0 && p.usage.desc.numa_node != node) {
        penalty = kUnknownNumaPenalty;
        int ni = topo_->numa_index(node), pi = topo_->numa_index(p.usage.desc.numa_node);
        if (ni >= 0 && pi >= 0 && pi < static_cast<int>(topo_->numa[ni].distances.size()))
          penalty = topo_->numa[ni].distances[pi];
      }
      order.emplace_back(penalty, id);
    }
  }
  std::stable_sort(order.begin(), order.end());
  for (const auto& [distance, id] : order) {
    auto a = take_locked(id, bytes, owner, kAlign);
    if (a.ok()) return a;
  }
  return Status(
      Code::kResourceExhausted,
      fmt::format("no pinned host pool has {} bytes free for CUDA device {} (NUMA node {})", bytes, cuda_device, node));
}

int Orchestrator::publish_p2pmem_bars() {
  int n = 0;
  for (size_t i = 0; i < topo_->devices.size(); ++i) {
    const PciDevice& d = topo_->devices[i];
    if (!d.p2pmem.present || !d.p2pmem.published || d.p2pmem.size == 0) continue;
    PoolDesc desc{d.addr.to_string() + " p2pmem",
                  PoolKind::kDeviceBar,
                  static_cast<int>(i),
                  d.numa_node,
                  d.p2pmem.available ? d.p2pmem.available : d.p2pmem.size,
                  nullptr};
    if (publish(std::move(desc)).ok()) ++n;
  }
  return n;
}

std::vector<PoolUsage> Orchestrator::usage() const {
  std::lock_guard lock(mu_);
  std::vector<PoolUsage> out;
  for (const auto& [id, p] : pools_) out.push_back(p.usage);
  return out;
}

}  // namespace dmx::topo
