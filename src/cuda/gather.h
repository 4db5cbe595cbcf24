// GPU gather: copy many small fragments (devmem TCP's <= 4 KiB pieces scattered over a bound
// dmabuf) into their places in a destination, with one kernel launch per batch.
//
// This header has no CUDA includes, so CPU code (transport/devmem) can call it; it is built only
// when DMX_HAVE_CUDA. Every descriptor is bounds-checked on the GPU against the source and
// destination sizes; a bad one is skipped and counted, never copied (no out-of-bounds access
// even if the host-side validation had a bug).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "core/clock.h"
#include "dmx/status.h"

namespace dmx::cuda {

struct GatherDesc {
  uint64_t src;  // byte offset into the source
  uint64_t dst;  // byte offset into the destination
  uint32_t len;
  uint32_t reserved = 0;
};
static_assert(sizeof(GatherDesc) == 24);

// Launches the gather kernel on `stream` (a cudaStream_t; nullptr = legacy default stream).
// `descs` must be device-readable. Out-of-bounds descriptors add to *errors (device memory).
// Returns the launch status only (execution errors surface at the next sync).
Status launch_gather(const GatherDesc* descs, uint32_t n, const void* src, uint64_t src_size, void* dst,
                     uint64_t dst_size, unsigned* errors, void* stream);

// A host copy into the destination (linear chunks the NIC put in host memory).
struct HostCopy {
  const void* host;  // pinned host memory, unchanged until the fence completes
  uint64_t dst;
  uint32_t len;
};

// An ordered queue of gathers on one device: its own stream, pinned descriptor slots, events as
// fences. Thread-safety: one owner thread.
class GatherQueue {
 public:
  static Result<std::unique_ptr<GatherQueue>> create(int device);
  ~GatherQueue();
  GatherQueue(const GatherQueue&) = delete;
  GatherQueue& operator=(const GatherQueue&) = delete;

  // Enqueues the fragment gather and the host copies; returns a fence (>= 1, increasing).
  Result<uint64_t> enqueue(const void* src, uint64_t src_size, void* dst, uint64_t dst_size,
                           std::span<const GatherDesc> descs, std::span<const HostCopy> host_copies);
  // Whether everything up to `fence` has finished; an error when the device failed or the GPU
  // rejected an out-of-bounds descriptor.
  Result<bool> done(uint64_t fence);
  Status wait(uint64_t fence, Deadline deadline);

  Result<void*> alloc_pinned(size_t size);
  void free_pinned(void* p);
  int device() const { return device_; }

 private:
  struct Impl;
  GatherQueue(int device, std::unique_ptr<Impl> impl);
  int device_;
  std::unique_ptr<Impl> impl_;
};

// Small helpers for tests and benchmarks (synchronous).
Result<void*> device_alloc(int device, size_t size);
void device_free(void* p);
Status copy_to_device(void* dst, const void* src, size_t n);
Status copy_to_host(void* dst, const void* src, size_t n);
Status device_memset(void* dst, int value, size_t n);

}  // namespace dmx::cuda
