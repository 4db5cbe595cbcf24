// Memory backends and asynchronous copy queues (internal).
//
// One MemoryBackend per memory kind and device. Device backends (cuda, sim) hand out CopyQueues:
// ordered queues of asynchronous copies (a CUDA stream on the copy engines, owning no thread; the
// sim backend's worker thread) with numbered fences to learn when copies have finished. A CUDA
// queue also copies between any two addresses its device reaches (peer GPUs, mapped peer memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/clock.h"
#include "dmx/memory.h"

namespace dmx {

// Thread-safety: a CopyQueue is used by one thread at a time (its owner, e.g. a stream worker).
class CopyQueue {
 public:
  virtual ~CopyQueue() = default;
  // Enqueue a copy; `host` must be host memory (staging slots are pinned, for real async copies).
  virtual Status to_host(void* host_dst, const void* dev_src, size_t n) = 0;
  virtual Status to_device(void* dev_dst, const void* host_src, size_t n) = 0;
  // Enqueue a copy between any two addresses this queue's device can reach: its own memory, a
  // peer GPU's (peer access enabled), a peer process's mapped allocation, pinned or host memory
  // (CUDA: cudaMemcpyDefault, which tells the direction from the addresses). For cuda_ipc.
  // kInvalidArgument (the queue stays usable) for addresses the device rejects.
  virtual Status copy(void* dst, const void* src, size_t n) {
    return Status(Code::kUnavailable, "this copy queue copies only between its device and the host");
  }
  // GPU push (docs/gpu-push.md): the same copy made by this queue's device's SMs (one small
  // kernel on the queue's stream, in order with its copies) instead of a copy engine, for small
  // copies whose cost is the copy engine's fixed cost. kUnavailable, with nothing enqueued, when
  // this queue cannot (no kernels, n too large, an address its SMs cannot reach: pageable host
  // memory, a peer GPU without peer access); the caller then copies.
  virtual Status push(void* dst, const void* src, size_t n) {
    return Status(Code::kUnavailable, "this copy queue has no SM copy");
  }
  // A list of copies between this queue's device memory and one pinned staging buffer (from
  // allocate_staging), as one: an inline table's pieces gathered into a slot or scattered out of
  // one (to_host: every src is device memory, every dst in the buffer; else the reverse). The
  // buffer's bytes between the spans may be read (scatter) but are never written. kUnavailable,
  // with nothing enqueued, when this queue cannot (the caller then copies each span).
  struct Span {
    void* dst;
    const void* src;
    size_t n;
  };
  virtual Status copy_list(const Span* spans, size_t n, bool to_host) {
    return Status(Code::kUnavailable, "this copy queue copies a list one span at a time");
  }
  // A fence after every copy enqueued so far. Fence ids increase by one from 1.
  virtual Result<uint64_t> record() = 0;
  // Whether the copies before `fence` have finished. An error means the device failed.
  virtual Result<bool> done(uint64_t fence) = 0;
  virtual Status wait(uint64_t fence, Deadline deadline) = 0;
  // Ok, or why this queue can copy no more: the device's sticky error (CUDA: one that breaks every
  // queue of the device in this process). Ask after a call failed, to tell a failure of that copy
  // from a broken device; a failed call's non-sticky error is cleared. Not for the hot path.
  virtual Status device_error() { return Status(); }
  // Enqueue the CRC32C (core/crc32c.h) of `n` bytes of device memory at `dev`, computed on the
  // device, in order with the copies. Returns a ticket; checksum_result(ticket) is the CRC once a
  // fence recorded after it has completed, for the last kChecksumsKept - 1 tickets.
  static constexpr uint64_t kChecksumsKept = 64;
  virtual Result<uint64_t> checksum(const void* dev, size_t n) {
    return Status(Code::kUnavailable, "this copy queue computes no checksums");
  }
  virtual uint32_t checksum_result(uint64_t ticket) const { return 0; }
};

// The CRC32C of `n` bytes at `p` in memory `where`, waiting for the device when it is device
// memory (on a queue from the process-wide cache). For chunks that payload paths move.
Result<uint32_t> checksum_memory(MemSpec where, const void* p, size_t n, Deadline deadline);

class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  virtual MemSpec spec() const = 0;
  // True when the CPU may load/store this memory directly (host, pinned).
  virtual bool host_accessible() const = 0;
  virtual Result<void*> allocate(size_t size) = 0;
  virtual void free(void* ptr, size_t size) = 0;
  // Device backends only.
  virtual Result<std::unique_ptr<CopyQueue>> create_queue() { return Status(Code::kInternal, "no copy queue"); }
  // Host memory suitable as the host side of this backend's asynchronous copies (pinned for CUDA).
  virtual Result<void*> allocate_staging(size_t size) = 0;
  virtual void free_staging(void* ptr, size_t size) = 0;
  // There is no pin of existing host memory (cudaHostRegister) on purpose: unpinning it again
  // (cudaHostUnregister) waits until the device is idle, holding a process-wide driver lock, which
  // stalls every CUDA call of the process while a persistent kernel runs (docs/cuda-notes.md).
  // Host memory that is not ours for the process's life goes through memory/bounce_pool.h.
};

// The process-wide backend for a memory kind; Code::kUnavailable with the reason when this
// process cannot use it. Backends live until the process exits.
Result<MemoryBackend*> backend_for(MemSpec where);

// Implemented in cuda_backend.cc when built with CUDA, else in cuda_stub.cc.
Result<MemoryBackend*> cuda_backend(int device);  // MemKind::kCuda
Result<MemoryBackend*> pinned_backend();          // MemKind::kPinned
// Number of CUDA devices, or why none can be used ("built without CUDA", "no driver: ...").
Result<int> cuda_device_count();
// Buffer::allocate_cumem's memory (memory/cuda/driver.h: alloc_cumem_range) and its release.
Result<void*> cuda_cumem_alloc(int device, size_t size, size_t block);
void cuda_cumem_free(void* ptr);
// Whether cuMem allocations on `device` can be shared between processes as POSIX fds, or why not.
Status cuda_cumem_ipc_supported(int device);

MemoryBackend* host_backend();
MemoryBackend* sim_backend(int device);

}  // namespace dmx
