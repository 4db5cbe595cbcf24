// The machine's memory as the engine places it: one orchestrator per sysfs root in a process
// (GPU memory and p2pmem BARs belong to the machine, not to a context), with the pools the
// engine publishes:
//   - pinned host memory, one pool per NUMA node (half the node's memory, at least 1 GiB);
//   - GPU memory, one pool per GPU in the topology (gpu_pool_bytes), with real memory behind it
//     when the engine gave a DeviceMemory hook (CUDA present): the pool's arena is allocated on
//     its first use, so a context that never asks costs the GPU nothing. Without it the pool only
//     keeps books (Allocation::ptr is null). A request that may grow the pool (NIC memory) and
//     does not fit gets an extent: one more pool of that GPU, exactly its size, with its own
//     arena, published while the request holds it and freed with it;
//   - p2pmem BARs that sysfs lists as published, sized by the kernel's `available`, allocated
//     through the kernel (p2pmem.h) when asked.
// Requests are ranked by the P2PDMA rule (orchestrator.h): TCP staging takes the host pool
// nearest the GPU it serves; devmem's memory (RX pool, TX ring, zcrx area, landing zone) the GPU
// pool nearest its NIC and GPU; p2pmem the BAR nearest all its clients.
// Thread-safety: every method is safe from any thread. Lifetime: a P2pmemBuffer or GpuBuffer
// keeps its Placement alive until it is destroyed.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "dmx/status.h"
#include "topo/orchestrator.h"
#include "topo/p2pmem.h"

namespace dmx::topo {

class Placement;

// Memory from a p2pmem BAR, mapped in this process. Move-only; destruction unmaps it (the pages go
// back to the device) and frees its booking.
class P2pmemBuffer {
 public:
  P2pmemBuffer() = default;
  P2pmemBuffer(P2pmemBuffer&& o) noexcept { *this = std::move(o); }
  P2pmemBuffer& operator=(P2pmemBuffer&& o) noexcept;
  P2pmemBuffer(const P2pmemBuffer&) = delete;
  P2pmemBuffer& operator=(const P2pmemBuffer&) = delete;
  ~P2pmemBuffer() { reset(); }
  void reset();

  void* data() const { return data_; }
  size_t size() const { return size_; }             // whole pages: at least what was asked
  const std::string& provider() const { return provider_; }  // the BAR's device, "0000:05:00.0"
  int distance() const { return distance_; }        // pci_p2pdma_distance_many to the clients
  explicit operator bool() const { return data_ != nullptr; }

 private:
  friend class Placement;
  std::shared_ptr<Placement> owner_;
  Allocation booking_;
  void* data_ = nullptr;
  size_t size_ = 0;
  std::string provider_;
  int distance_ = -1;
};

// Device memory from a published GPU pool. Move-only; destruction frees its booking (the arena
// stays with the pool). `data()` is null where the pool only keeps books (no CUDA).
class GpuBuffer {
 public:
  GpuBuffer() = default;
  GpuBuffer(GpuBuffer&& o) noexcept { *this = std::move(o); }
  GpuBuffer& operator=(GpuBuffer&& o) noexcept;
  GpuBuffer(const GpuBuffer&) = delete;
  GpuBuffer& operator=(const GpuBuffer&) = delete;
  ~GpuBuffer() { reset(); }
  void reset();

  void* data() const { return data_; }
  size_t size() const { return booking_.size; }
  int cuda_device() const { return cuda_device_; }  // -1: the GPU is not a CUDA device here
  const std::string& pool() const { return pool_; }
  explicit operator bool() const { return booking_.size != 0; }

 private:
  friend class Placement;
  std::shared_ptr<Placement> owner_;
  Allocation booking_;
  void* data_ = nullptr;
  int cuda_device_ = -1;
  std::string pool_;
};

// How a GPU request is served: `align` (a power of two, at least Orchestrator::kAlign) for the
// buffer's offset in its pool and its address (memory exported as a dma-buf: whole pages);
// `grow`: when the nearest GPU pool has no room, an extent of that GPU (placement.h's opening)
// rather than a farther pool.
struct GpuRequest {
  uint64_t align = Orchestrator::kAlign;
  bool grow = false;
};

// How the engine gives GPU pools real memory (CUDA present): allocate `bytes` on CUDA device
// `ordinal`, and free it. Both run with no lock of the placement held.
struct DeviceMemory {
  std::function<Result<void*>(int ordinal, uint64_t bytes)> allocate;
  std::function<void(int ordinal, void* p, uint64_t bytes)> free;
};

class Placement : public std::enable_shared_from_this<Placement> {
 public:
  static constexpr uint64_t kDefaultGpuPoolBytes = uint64_t{64} << 20;

  // This process's placement for `sysfs_root`, built on first use (discover_local); kUnavailable
  // with discovery's reason when the tree cannot be read (asked again next time). `gpu_memory`
  // and `gpu_pool_bytes` count on first creation only; a later caller's hook fills in a missing one.
  static Result<std::shared_ptr<Placement>> for_root(const std::string& sysfs_root, DeviceMemory gpu_memory = {},
                                                     uint64_t gpu_pool_bytes = kDefaultGpuPoolBytes);
  // A placement of its own (tests: fixtures and the kernel double).
  static std::shared_ptr<Placement> create(std::shared_ptr<const Topology> topo, std::shared_ptr<P2pmemKernel> kernel,
                                           DeviceMemory gpu_memory = {},
                                           uint64_t gpu_pool_bytes = kDefaultGpuPoolBytes);
  ~Placement();

  // TCP staging for `cuda_device` (or a sim device of that number): the NUMA node of the host pool
  // nearest to it, booked to `owner` in `*booked` until unstage(*booked); -1 when no host pool
  // has room (no preference then; nothing booked).
  int stage(int cuda_device, uint64_t bytes, const std::string& owner, Allocation* booked);
  void unstage(const Allocation& booked) { give_back(booked); }

  // `bytes` (rounded up to whole pages) of p2pmem from the published BAR nearest to every device
  // in `clients` (PCI addresses, "0000:17:00.0"; the provider itself may be one), mapped here and
  // booked to `owner`. Errors: kInvalidArgument for zero bytes or an address not in the topology;
  // kResourceExhausted when no published BAR every client reaches has room (each considered BAR
  // and why it was refused, the kernel's ENOMEM included); kUnavailable when the kernel refused
  // every candidate otherwise (ENOENT: kernel before 6.2; EACCES: not root; ENODEV).
  Result<P2pmemBuffer> allocate_p2pmem(std::span<const std::string> clients, uint64_t bytes, std::string owner);

  // `bytes` of GPU memory from the GPU pool nearest to every device in `clients` (as above).
  // Errors as allocate_p2pmem's; kUnavailable when the pool's arena could not be allocated, or its
  // memory is not `how.align`-aligned.
  Result<GpuBuffer> allocate_gpu(std::span<const std::string> clients, uint64_t bytes, std::string owner,
                                 GpuRequest how = {});

  // Memory a NIC `nic` (an interface name of the topology) reaches for a devmem path whose
  // gatherer and kernels run on CUDA device `cuda_device`: its RX pool, TX ring, zcrx area, or
  // the landing zone receives land in before the gatherer copies them on. `bytes` from the GPU
  // pool nearest to the NIC and that GPU by the P2PDMA rule (grown by an extent when it has no
  // room), at `align`, booked to `owner`. Errors: kInvalidArgument for a NIC or GPU the topology
  // lacks; kUnavailable when the nearest pool is another GPU's (the gatherer reads and writes
  // only its own device's memory) or has no memory behind it (no CUDA); allocate_gpu's otherwise
  // (a GPU the NIC cannot reach: kResourceExhausted with the reason).
  Result<GpuBuffer> allocate_nic_memory(const std::string& nic, int cuda_device, uint64_t bytes, std::string owner,
                                        uint64_t align = Orchestrator::kAlign);

  std::vector<PoolUsage> usage() const { return orch_.usage(); }
  const Topology& topology() const { return *topo_; }
  const Orchestrator& orchestrator() const { return orch_; }

 private:
  Placement(std::shared_ptr<const Topology> topo, std::shared_ptr<P2pmemKernel> kernel, DeviceMemory gpu_memory,
            uint64_t gpu_pool_bytes);
  void publish_all();
  Result<std::vector<int>> resolve(std::span<const std::string> clients) const;
  void give_back(const Allocation& a);
  friend class P2pmemBuffer;
  friend class GpuBuffer;

  struct GpuArena {
    int ordinal = -1;
    uint64_t bytes = 0;
    void* base = nullptr;
    std::string failed;  // why the arena could not be allocated (asked again on the next request)
    bool extent = false; // made for one request: unpublished and freed with it
  };
  Result<GpuBuffer> back(Allocation a, const std::string& owner, uint64_t align);
  Result<GpuBuffer> grow(int pci, uint64_t bytes, const std::string& owner, uint64_t align);

  std::shared_ptr<const Topology> topo_;
  std::shared_ptr<P2pmemKernel> kernel_;
  Orchestrator orch_;
  const uint64_t gpu_pool_bytes_;
  mutable std::mutex mu_;  // guards gpu_memory_, arenas_, bar_paths_, extents_; never held while calling out
  DeviceMemory gpu_memory_;
  std::map<PoolId, GpuArena> arenas_;
  uint64_t extents_ = 0;  // extents made so far (their names' numbers)
  std::map<PoolId, std::string> bar_paths_;  // p2pmem pool -> its allocate file
};

// For other transports (rdma): p2pmem nearest to `clients` from this process's placement for
// `sysfs_root` (the sysfs_root setting), as Placement::allocate_p2pmem; kUnavailable when the
// topology cannot be read.
Result<P2pmemBuffer> allocate_p2pmem(const std::string& sysfs_root, std::span<const std::string> clients,
                                     uint64_t bytes, std::string owner);

}  // namespace dmx::topo
