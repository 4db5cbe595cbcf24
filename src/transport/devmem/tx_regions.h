// Registered memory bound for devmem TX, so that sends from it go straight from it.
//
// Context::register_memory offers each registration to the transports; the devmem transport makes
// a TxRegion of device memory and the registration keeps it (released with it). The first path
// that sends from inside it exports it as a dma-buf and binds it with bind-tx on that path's NIC,
// once per (kernel, NIC); later sends reuse the binding with the dma-buf offset. A refusal (the
// exporter's or the kernel's) is cached too, and such sends go through the path's TX ring with
// that reason. A path keeps the region alive while its sends from it are in flight, so
// deregistration never unbinds memory the NIC still reads. Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "memory/gtlb.h"
#include "transport/devmem/devmem.h"
#include "transport/devmem/region.h"

namespace dmx::devmem {

class TxRegion {
 public:
  explicit TxRegion(MemRegion memory) : memory_(memory) {}
  ~TxRegion();  // leaves the registry and its translations
  const MemRegion& memory() const { return memory_; }
  bool contains(const MemRegion& r) const;
  // The binding of this region on `seams`' NIC (made on first use), or why there is none.
  Result<const BoundRegion*> bound_for(const HostSeams& seams);

 private:
  struct Slot {
    std::unique_ptr<BoundRegion> bound;
    Status refused;
  };
  friend std::shared_ptr<TxRegion> register_tx_region(const MemRegion& memory);
  MemRegion memory_;
  uint64_t id_ = 0;  // in the registry
  std::mutex mu_;  // guards slots_; held across the first bind of a slot
  std::map<std::pair<const void*, int>, Slot> slots_;
};

// Records `memory` for TX; dropped from the registry when the last holder releases it.
std::shared_ptr<TxRegion> register_tx_region(const MemRegion& memory);
// The live region containing `src` entirely, or null. Looked up in a GTLB (memory/gtlb.h); a
// miss scans the regions and fills it.
std::shared_ptr<TxRegion> find_tx_region(const MemRegion& src);
// The registry's translation counters (tests).
GtlbCounters tx_region_translations();

}  // namespace dmx::devmem
