#include "transport/devmem/tx_regions.h"

#include <fmt/format.h>

#include <map>
#include <vector>

namespace dmx::devmem {
namespace {

struct Registry {
  std::mutex mu;
  uint64_t next_id = 1;
  std::map<uint64_t, std::weak_ptr<TxRegion>> regions;  // by id
  Gtlb gtlb{Gtlb::Limits{4096, 256}};                    // address -> region id
};
Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: registrations may outlive statics
  return *r;
}

}  // namespace

bool TxRegion::contains(const MemRegion& r) const {
  if (r.where != memory_.where || r.size == 0) return false;
  auto base = reinterpret_cast<uintptr_t>(memory_.ptr), p = reinterpret_cast<uintptr_t>(r.ptr);
  return p >= base && p - base <= memory_.size && r.size <= memory_.size - (p - base);
}

Result<const BoundRegion*> TxRegion::bound_for(const HostSeams& seams) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = slots_[{seams.netlink->kernel_id(), seams.ifindex}];
  if (s.bound) return static_cast<const BoundRegion*>(s.bound.get());
  if (!s.refused.ok()) return s.refused;
  auto b = BoundRegion::bind_tx(*seams.netlink, seams.ifindex, memory_, seams.exporter);
  if (!b.ok()) {
    s.refused = Status(Code::kUnavailable, fmt::format("bind-tx of the registered region ({} bytes of {}) to {}: {}",
                                                       memory_.size, to_string(memory_.where), seams.ifname,
                                                       b.status().message()));
    return s.refused;
  }
  s.bound = std::move(*b);
  return static_cast<const BoundRegion*>(s.bound.get());
}

TxRegion::~TxRegion() {
  Registry& g = registry();
  std::lock_guard<std::mutex> lock(g.mu);
  g.regions.erase(id_);
  g.gtlb.invalidate(reinterpret_cast<uintptr_t>(memory_.ptr), memory_.size);
}

std::shared_ptr<TxRegion> register_tx_region(const MemRegion& memory) {
  auto r = std::make_shared<TxRegion>(memory);
  Registry& g = registry();
  std::lock_guard<std::mutex> lock(g.mu);
  r->id_ = g.next_id++;
  g.regions.emplace(r->id_, r);
  return r;
}

std::shared_ptr<TxRegion> find_tx_region(const MemRegion& src) {
  // Regions that lock() made ours for a moment are let go after the registry's lock: the last
  // reference going runs ~TxRegion, which takes that lock.
  std::vector<std::shared_ptr<TxRegion>> release_later;
  Registry& g = registry();
  std::lock_guard<std::mutex> lock(g.mu);
  auto addr = reinterpret_cast<uintptr_t>(src.ptr);
  if (auto hit = g.gtlb.lookup(addr, src.size)) {
    if (auto it = g.regions.find(hit->value); it != g.regions.end()) {
      if (auto r = it->second.lock(); r && r->contains(src)) return r;
      else release_later.push_back(std::move(r));
    }
  }
  for (const auto& [id, w] : g.regions) {
    auto r = w.lock();
    if (r && r->contains(src)) {
      const MemRegion& m = r->memory();
      g.gtlb.fill(GtlbEntry{reinterpret_cast<uintptr_t>(m.ptr), m.size, 0, id}, addr, src.size);
      return r;
    }
    release_later.push_back(std::move(r));
  }
  return nullptr;
}

GtlbCounters tx_region_translations() {
  Registry& g = registry();
  std::lock_guard<std::mutex> lock(g.mu);
  return g.gtlb.counters();
}

}  // namespace dmx::devmem
