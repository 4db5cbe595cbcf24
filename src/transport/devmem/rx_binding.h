// One devmem RX binding per (kernel, NIC, queue set, memory) per process, shared by the paths
// that receive through those queues.
//
// The kernel lets a queue carry one memory provider: a second bind-rx of a bound queue answers
// EEXIST ("designated queue already memory provider bound"). So the RX pool and its binding are
// not a path's but the process's: the first path (or offer) that needs them takes the pool from
// the machine's placement (HostSeams::place, booked to "devmem RX pool of IF"), exports and binds
// it; later ones share it; the last holder to let go unbinds (closing the netlink socket) and
// gives the pool back. Each path still returns its own tokens on its own socket.
// A queue bound by someone else (another process, XDP) fails acquire() with kUnavailable and the
// kernel's words, so that the engine offers the next transport. Thread-safe.
#pragma once

#include <memory>

#include "dmx/memory.h"
#include "transport/devmem/devmem.h"
#include "transport/devmem/region.h"

namespace dmx::devmem {

class SharedRxBinding {
 public:
  SharedRxBinding(PlacedMemory pool, std::unique_ptr<BoundRegion> bound)
      : pool_(std::move(pool)), bound_(std::move(bound)) {}
  const BoundRegion& bound() const { return *bound_; }
  uint64_t pool_size() const { return pool_.region.size; }
  const std::string& where() const { return pool_.where; }  // the pool it came from, and why

 private:
  PlacedMemory pool_;                   // given back after the binding (declaration order)
  std::unique_ptr<BoundRegion> bound_;
};

// The live binding of `seams` (kernel_id, ifindex, queues, memory), or a new one with a
// `pool_size`-byte pool. A live binding is reused whatever its size.
Result<std::shared_ptr<SharedRxBinding>> acquire_rx_binding(const HostSeams& seams, uint64_t pool_size);

// How many bindings are alive in this process (tests).
size_t live_rx_bindings();

}  // namespace dmx::devmem
