// p2pmem orchestrator: publishers expose memory pools; clients ask for bytes that a list of PCI
// devices will touch and get the pool closest to all of them (seed 004, after the kernel's
// pci_p2pmem_find_many).
//
// Distance of a pool to its clients:
//   - device pools (GPU memory, device BARs): the kernel's pci_p2pdma_distance_many from the
//     pool's device; a pool any client cannot reach (NOT_SUPPORTED) is not a candidate;
//   - pinned host memory on NUMA node N: for each client, its hops up to the root complex (the
//     kernel's chain length) plus, when the client sits on another node, the SLIT distance
//     difference (typically 21 - 10 = 11; 10 when the SLIT is unknown).
// Ties are broken deterministically: smaller total distance, then the pool published first
// (the kernel picks at random among ties; dmx wants reproducible placement).
//
// The orchestrator keeps the books (offsets inside each pool, usage, peaks); it does not map
// memory. A publisher that registers a base pointer gets `base + offset` back in allocations.
// Thread-safety: all methods are safe to call concurrently (one mutex guards the pool table).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "dmx/status.h"
#include "topo/distance.h"
#include "topo/topology.h"

namespace dmx::topo {

enum class PoolKind : uint8_t { kPinnedHost, kGpu, kDeviceBar };
std::string_view pool_kind_name(PoolKind k);
// A set of pool kinds, for requests that only some kinds can serve (staging must be host memory).
using PoolKinds = uint8_t;
constexpr PoolKinds kind_bit(PoolKind k) { return static_cast<PoolKinds>(1u << static_cast<unsigned>(k)); }
constexpr PoolKinds kAnyPool = 0xff;

struct PoolDesc {
  std::string name;  // for logs: "pinned:node0", "cuda:1", "0000:05:00.0 bar"
  PoolKind kind = PoolKind::kPinnedHost;
  int pci = -1;        // provider device index (kGpu, kDeviceBar)
  int numa_node = -1;  // kPinnedHost
  uint64_t capacity = 0;
  void* base = nullptr;  // optional: where the memory is mapped in this process
};

using PoolId = uint32_t;

struct Allocation {
  PoolId pool = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  void* ptr = nullptr;  // base + offset when the pool has a base
};

struct Candidate {
  PoolId pool = 0;
  int total_distance = -1;
  std::string why;
};

struct PoolUsage {
  PoolId id = 0;
  PoolDesc desc;
  bool published = true;
  uint64_t used = 0;
  uint64_t peak = 0;
  uint64_t allocations = 0;  // live
  uint64_t total_allocations = 0;
  std::map<std::string, uint64_t> owners;  // who holds the live allocations: owner -> bytes
};

class Orchestrator {
 public:
  static constexpr uint64_t kAlign = 64;  // every allocation's offset and size are multiples of it

  explicit Orchestrator(std::shared_ptr<const Topology> topo);

  // Registers a pool. kInvalidArgument for a zero capacity or a device index outside the topology.
  Result<PoolId> publish(PoolDesc desc);
  // Publishes a pool of exactly `bytes` (rounded up to kAlign) and allocates all of it to `owner`
  // under one lock, so no other request sees it with room: an extent made for one request
  // (Placement grows a GPU pool this way). Unpublish it before freeing, and it is forgotten then.
  Result<Allocation> publish_allocated(PoolDesc desc, uint64_t bytes, std::string owner);
  // Hides a pool from new requests; live allocations stay valid and are freed as usual. The pool
  // is forgotten when its last allocation is freed. kNotFound for an unknown id.
  Status unpublish(PoolId id);
  // Published pools every client can reach, nearest first (see the tie-break above), each with
  // room for `bytes`. Empty when none qualifies. kInvalidArgument for an unknown client.
  Result<std::vector<Candidate>> find_many(std::span<const int> clients, uint64_t bytes,
                                           PoolKinds kinds = kAnyPool) const;
  // Allocates from the best candidate of `kinds` (64-byte aligned, first fit), booked to `owner`
  // (usage() lists it). kResourceExhausted when no reachable pool has room; the message lists the
  // pools considered and why each was refused.
  Result<Allocation> allocate(std::span<const int> clients, uint64_t bytes, std::string owner = {},
                              PoolKinds kinds = kAnyPool);
  // Allocates from pool `id` (a caller that ranked the candidates itself and tries them in turn),
  // at an offset that is a multiple of `align` (a power of two, at least kAlign; memory exported
  // as a dma-buf wants whole pages). kInvalidArgument for another alignment.
  Result<Allocation> allocate_from(PoolId id, uint64_t bytes, std::string owner = {}, uint64_t align = kAlign);
  Status free(const Allocation& a);

  // Staging for the TCP path: pinned host memory on the NUMA node closest to CUDA device
  // `cuda_device` (falls back to the nearest pinned pool when that node has none or is full).
  int numa_node_for_cuda_device(int cuda_device) const;
  // With the GPU in the topology, host pools are ranked by the P2PDMA rule with the GPU as the one
  // client (hops to the root complex plus the SLIT difference), as find_many ranks them.
  Result<Allocation> allocate_staging(int cuda_device, uint64_t bytes, std::string owner = {});

  // Publishes every device BAR that sysfs lists as published p2pmem.
  int publish_p2pmem_bars();

  std::vector<PoolUsage> usage() const;
  const Topology& topology() const { return *topo_; }

 private:
  struct Pool {
    PoolUsage usage;
    std::map<uint64_t, uint64_t> free_ranges;  // offset -> length
    std::map<uint64_t, std::string> owner_at;  // offset of a live allocation -> its owner
  };
  int distance_to(const Pool& p, std::span<const int> clients, std::string* why) const;
  std::vector<Candidate> candidates_locked(std::span<const int> clients, uint64_t bytes, PoolKinds kinds,
                                          std::string* refusals) const;
  Result<Allocation> take_locked(PoolId id, uint64_t bytes, std::string owner, uint64_t align);

  std::shared_ptr<const Topology> topo_;
  mutable std::mutex mu_;  // guards pools_ and next_id_
  std::map<PoolId, Pool> pools_;
  PoolId next_id_ = 1;
};

}  // namespace dmx::topo
