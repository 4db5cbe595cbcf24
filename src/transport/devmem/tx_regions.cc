#include "transport/devmem/tx_regions.h"

#include <fmt/format.h>

#include <vector>

namespace dmx::devmem {
namespace {

struct Registry {
  std::mutex mu;
  std::vector<std::weak_ptr<TxRegion>> regions;
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

std::shared_ptr<TxRegion> register_tx_region(const MemRegion& memory) {
  auto r = std::make_shared<TxRegion>(memory);
  Registry& g = registry();
  std::lock_guard<std::mutex> lock(g.mu);
  std::erase_if(g.regions, [](const std::weak_ptr<TxRegion>& w) { return w.expired(); });
  g.regions.push_back(r);
  return r;
}

std::shared_ptr<TxRegion> find_tx_region(const MemRegion& src) {
  Registry& g = registry();
  std::lock_guard<std::mutex> lock(g.mu);
  for (const auto& w : g.regions)
    if (auto r = w.lock(); r && r->contains(src)) return r;
  return nullptr;
}

}  // namespace dmx::devmem
