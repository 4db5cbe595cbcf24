// The devmem transport's factory header: the only one visible outside this folder.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/capability.h"
#include "dmx/memory.h"
#include "dmx/status.h"
#include "transport/devmem/gather.h"
#include "transport/devmem/kernel.h"
#include "transport/devmem/region.h"
#include "transport/devmem/zcrx.h"

namespace dmx {
class Config;
}
namespace dmx::topo {
class Placement;
}

namespace dmx::devmem {

// Every devmem TCP capability of this host: the netdev generic-netlink family and its bind-rx /
// bind-tx ops, then per NIC an actual bind attempt with the kernel's errno and extack text,
// NIC header-split / ntuple / RSS state, dmabuf export of CUDA memory.
std::vector<Capability> probe();

// For connection-time selection: ok when devmem TCP can be used through `ifname` now (kernel ops,
// NIC configured, driver passes bind-rx and bind-tx device checks, CUDA memory exports as dmabuf),
// else kUnavailable with the first reason, to be logged once and shown in statistics. An empty
// ifname (setting devmem_ifname unset) is "devmem off". Non-destructive, like probe().
//
// The building blocks for the engine live in this folder: region.h (BoundRegion: dmabuf export +
// netlink binding), rx.h (DevmemRx), tx.h (DevmemTx), kernel.h (the seam), nic.h (steering).
Status usable(const std::string& ifname);

// What a devmem path's memory is for. Each is booked to its own owner in the machine's placement:
// "devmem RX pool of IF" (the process's, bound to the RX queues), "devmem TX ring of IF to PEER",
// "devmem zcrx area of IF to PEER", "devmem landing zone of IF to PEER" (the memory a receive
// lands in before it reaches a destination the gatherer cannot write: a write into a registered
// region of other memory).
enum class MemoryUse : uint8_t { kRxPool, kTxRing, kZcrxArea, kLanding };
std::string_view memory_use_name(MemoryUse use);  // "RX pool", "TX ring", "zcrx area", "landing zone"

// Memory of a devmem path: `region`, held (with its booking) by `keep`; `where` says which pool
// and why, or why it was not placed.
struct PlacedMemory {
  MemRegion region;
  std::shared_ptr<void> keep;
  std::string where;
};

// What one devmem connection needs from this host, as seams: the kernel in production
// (kernel_seams), the socket-pair double in tests (tests/devmem/socket_double.h, SimNic::seams).
// Copyable; the functions may be called from any thread, one call at a time per object made.
struct HostSeams {
  std::shared_ptr<NetlinkOps> netlink;  // binds the RX pool (bind-rx) and the TX ring (bind-tx)
  DmabufExporter exporter;              // memory -> dmabuf (export_dmabuf for CUDA memory)
  // One connected TCP socket's devmem system calls (the fd stays owned by the caller).
  std::function<std::unique_ptr<KernelSocket>(int fd)> socket;
  // A gatherer out of pools in `memory` (CUDA gather kernel; host gatherer for host pools).
  std::function<Result<std::unique_ptr<Gatherer>>()> gatherer;
  MemSpec memory;                 // the memory of the RX pool, the TX ring and the zcrx area (cuda:N)
  // The destinations the gatherer writes; empty: the pool's rule (a host pool: host, pinned and
  // sim memory; a device pool: memory of its own device).
  std::function<bool(const MemSpec&)> gathers_into;
  // `bytes` of memory for `use` (MemoryUse above) of the path to `peer` (empty for the RX pool,
  // which is the process's). Production: the machine's placement (placement_memory); empty, or
  // when it refuses: a buffer allocated in `memory` (place_memory).
  std::function<Result<PlacedMemory>(MemoryUse use, uint64_t bytes, const std::string& peer)> place;
  std::string ifname;             // the devmem NIC (TX sockets are bound to it: SO_BINDTODEVICE)
  int ifindex = 0;
  std::vector<uint32_t> queues;   // the RX queues the pool is bound to (setting devmem_queues)
  // An io_uring zcrx interface queue: `queue` of `ifindex` with the dma-buf `dmabuf_fd`
  // (`dmabuf_size` bytes, all of it the area) receiving on `sock_fd`, with `rq_entries` refill
  // entries. Production: open_kernel_zcrx behind the kernel-version check; tests: SimNic's double.
  // Empty: these seams have no zcrx (the path then receives with devmem RX).
  std::function<Result<std::unique_ptr<ZcrxKernel>>(int ifindex, uint32_t queue, int sock_fd, int dmabuf_fd,
                                                    uint64_t dmabuf_size, uint32_t rq_entries)>
      zcrx;
};

// The machine's placement (topo/placement.h), built on first use; kUnavailable without topology.
using PlacementSource = std::function<Result<std::shared_ptr<topo::Placement>>()>;
// The placement seam: each call books `bytes` of the GPU pool nearest NIC `ifname` and
// cuda:`cuda_device` by the P2PDMA rule (Placement::allocate_nic_memory; whole pages for the
// memory the NIC is bound to; the pool grows by an extent when it has no room) to the use's owner
// (MemoryUse above), for as long as the PlacedMemory is held; the placement's refusal otherwise.
// The region is labelled `as` (production: cuda:`cuda_device`; the double's pools are host memory).
std::function<Result<PlacedMemory>(MemoryUse, uint64_t, const std::string&)> placement_memory(
    PlacementSource placement, std::string ifname, int cuda_device, MemSpec as);

// `bytes` for `use` of the path to `peer`: from seams.place, else (no seam, its refusal, or
// memory the path cannot use: RX pool, TX ring and zcrx area must be in seams.memory) a buffer in
// seams.memory, its `where` saying why it was not placed. An allocation failure of that buffer is
// the error, with both reasons.
Result<PlacedMemory> place_memory(const HostSeams& seams, MemoryUse use, uint64_t bytes, const std::string& peer);

// The production seams: netlink and sockets of the running kernel, CUDA dmabuf export and the
// CUDA gather kernel on `cuda_device`, the NIC and queues of settings devmem_ifname and
// devmem_queues ("A-B" or "A"). kUnavailable / kInvalidArgument with the reason otherwise.
Result<HostSeams> kernel_seams(const Config& config, int cuda_device);

// "A-B" or "A" -> the queue ids; kInvalidArgument when malformed.
Result<std::vector<uint32_t>> parse_queue_range(const std::string& text);

}  // namespace dmx::devmem
