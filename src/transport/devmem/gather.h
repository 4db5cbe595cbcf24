// Gathering received devmem fragments into the user's destination.
//
// A recvmsg(MSG_SOCK_DEVMEM) call yields fragments (<= 4 KiB pieces scattered over the bound RX
// dmabuf, the "pool") and linear chunks (bytes the NIC could not split off, copied by the kernel
// into our host iov). A Gatherer copies both into the destination, asynchronously, and answers
// with a fence; tokens for those fragments go back to the kernel only once the fence completes.
//
// Implementations: host (memcpy for host/pinned destinations, the copy queue for sim device
// memory; pools that the CPU can read, as the test double makes) and CUDA (a gather kernel over
// a pool of GPU memory; src/cuda). Thread-safety: one owner thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/clock.h"
#include "dmx/memory.h"
#include "dmx/status.h"

namespace dmx::devmem {

struct Fragment {
  uint64_t src_offset;  // into the pool memory (already validated against its size)
  uint64_t dst_offset;  // into the destination
  uint32_t len;
};
struct LinearChunk {
  uint64_t host_offset;  // into the linear host buffer passed to recvmsg
  uint64_t dst_offset;
  uint32_t len;
};

class Gatherer {
 public:
  virtual ~Gatherer() = default;
  // Enqueues the copies. `pool` is the whole bound memory; offsets were validated by the caller,
  // and implementations check them again (an out-of-bounds copy is an error, never performed).
  // `linear_host` must stay unchanged until the returned fence completes.
  virtual Result<uint64_t> enqueue(MemRegion pool, std::span<const Fragment> frags, const uint8_t* linear_host,
                                   std::span<const LinearChunk> linear, MemRegion dst) = 0;
  // Fence 0 is always complete (used for tokens that needed no copy).
  virtual Result<bool> done(uint64_t fence) = 0;
  virtual Status wait(uint64_t fence, Deadline deadline) = 0;
  // Host memory for recvmsg's iov that enqueue() can copy from asynchronously.
  virtual Result<void*> allocate_linear(size_t size) = 0;
  virtual void free_linear(void* p, size_t size) = 0;
};

// Pools must be host-readable (host or pinned); destinations host, pinned or sim.
std::unique_ptr<Gatherer> make_host_gatherer();
// Pools and destinations in CUDA memory of `device`. kUnavailable without CUDA or a device.
Result<std::unique_ptr<Gatherer>> make_cuda_gatherer(int device);

}  // namespace dmx::devmem
