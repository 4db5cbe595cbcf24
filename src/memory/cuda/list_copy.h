// A CUDA copy queue's lists (CopyQueue::copy_list): an inline table's device pieces gathered into
// a staging slot, or scattered out of one, with one kernel and one copy-engine copy per list
// instead of a cudaMemcpyAsync per piece (whose API cost, taken one at a time by the driver, bound
// the staged path at 16 KiB blocks). The pieces go through a device twin of the slot's range:
// gather packs them into the twin with the segment copy kernel, then one device-to-host copy per
// run of adjacent host spans; scatter copies the range host-to-device, then the kernel unpacks it.
// The SMs touch only this device's memory (no loads over PCIe whatever the push plan says); the
// copy engines cross PCIe at their full rate. Internal; CUDA builds only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "memory/backend.h"
#include "memory/cuda/segment_copy.h"

namespace dmx::cuda {

// Thread-safety: its CudaQueue's (one thread at a time). The device must be current.
class ListCopier {
 public:
  ListCopier(int device, void* stream) : device_(device), stream_(stream) {}
  // Frees the buffers: only once the stream's work has finished (a queue whose device hung
  // leaks its copier instead).
  ~ListCopier();
  ListCopier(const ListCopier&) = delete;
  ListCopier& operator=(const ListCopier&) = delete;

  // Enqueues `spans` on the stream. `fence` is the fence the queue records next (it covers the
  // list), `completed` the last fence seen done (buffers of lists at or below it are free again).
  // kUnavailable, nothing enqueued: a device side outside this device's allocations, or every
  // buffer busy. Other errors come from CUDA after something may have been enqueued.
  Status enqueue(const CopyQueue::Span* spans, size_t n, bool to_host, uint64_t fence, uint64_t completed);

  // Lists at most this many bytes from the first host byte to the last (a staging slot's).
  static constexpr size_t kMaxRange = size_t{64} << 20;
  // Buffers (descriptors and twin) kept per queue: lists in flight at once, bounded.
  static constexpr size_t kMaxBuffers = 32;

 private:
  struct Buffer {
    SegmentCopy* descs = nullptr;  // pinned and mapped: the kernel reads them over PCIe
    size_t desc_cap = 0;
    char* twin = nullptr;  // device memory
    size_t twin_cap = 0;
    uint64_t fence = 0;  // free once this fence completed
  };
  // Whether [p, p + n) lies in one allocation of this device (asked of the driver once per
  // allocation per list: the kernel trusts its descriptors, and a fault would be sticky).
  Status on_device(const void* p, size_t n);
  Result<Buffer> take(size_t descs, size_t range, uint64_t completed);

  const int device_;
  void* const stream_;
  std::deque<Buffer> busy_;   // in enqueue order, so in fence order
  std::vector<Buffer> idle_;
  struct Range {
    uintptr_t base, end;
  };
  std::vector<Range> known_;  // this list's allocations seen so far
};

}  // namespace dmx::cuda
