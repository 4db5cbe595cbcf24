#include "transport/devmem/rx_binding.h"

#include <fmt/format.h>

#include <map>
#include <mutex>
#include <tuple>

namespace dmx::devmem {
namespace {

using Key = std::tuple<const void*, int, std::vector<uint32_t>, int, int>;

struct Registry {
  std::mutex mu;  // held across a bind: two paths never race to bind the same queues
  std::map<Key, std::weak_ptr<SharedRxBinding>> live;
};
Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: paths may outlive static destruction
  return *r;
}

}  // namespace

Result<std::shared_ptr<SharedRxBinding>> acquire_rx_binding(const HostSeams& seams, uint64_t pool_size) {
  if (!seams.netlink) return Status(Code::kInvalidArgument, "devmem rx binding: no netlink seam");
  Key key{seams.netlink->kernel_id(), seams.ifindex, seams.queues, static_cast<int>(seams.memory.kind),
          seams.memory.device};
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto it = r.live.begin(); it != r.live.end();)  // drop dead entries
    it = it->second.expired() ? r.live.erase(it) : std::next(it);
  if (auto live = r.live[key].lock()) return live;
  DMX_ASSIGN_OR_RETURN(PlacedMemory pool, place_memory(seams, MemoryUse::kRxPool, pool_size, ""));
  auto bound = BoundRegion::bind_rx(*seams.netlink, seams.ifindex, seams.queues, pool.region, seams.exporter);
  if (!bound.ok()) {
    const std::string& m = bound.status().message();
    std::string queues = seams.queues.empty() ? std::string("none")
                                              : fmt::format("{}-{}", seams.queues.front(), seams.queues.back());
    if (m.find(fmt::format("(errno {})", EEXIST)) != std::string::npos || m.find(fmt::format("(errno {})", EBUSY)) != std::string::npos)
      return Status(Code::kUnavailable,
                    fmt::format("devmem: no free RX queue: queues {} of {} are held by another memory provider, "
                                "another process or XDP ({})", queues, seams.ifname, m));
    return Status(bound.status().code(), fmt::format("bind-rx of the RX pool to {} queues {}: {}", seams.ifname, queues, m));
  }
  auto shared = std::make_shared<SharedRxBinding>(std::move(pool), std::move(*bound));
  r.live[key] = shared;
  return shared;
}

size_t live_rx_bindings() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  size_t n = 0;
  for (auto& [k, w] : r.live) n += w.expired() ? 0 : 1;
  return n;
}

}  // namespace dmx::devmem
