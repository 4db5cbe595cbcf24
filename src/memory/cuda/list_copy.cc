// The CUDA queue's lists (list_copy.h).
#include "memory/cuda/list_copy.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <bit>

#include "memory/cuda/driver.h"
#include "memory/cuda/runtime.h"

namespace dmx::cuda {

ListCopier::~ListCopier() {
  idle_.insert(idle_.end(), busy_.begin(), busy_.end());
  for (Buffer& b : idle_) {
    (void)cudaFreeAsync(b.twin, static_cast<cudaStream_t>(stream_));
    (void)cudaFreeHost(b.descs);
  }
}

Status ListCopier::on_device(const void* p, size_t n) {
  auto at = reinterpret_cast<uintptr_t>(p);
  for (const Range& r : known_)
    if (at >= r.base && at <= r.end && n <= r.end - at) return Status();
  auto range = driver::allocation_range(p);
  if (!range.ok() || range->device != device_)
    return Status(Code::kUnavailable, fmt::format("a list's device side {} is not memory of cuda:{}{}", p, device_,
                                                  range.ok() ? "" : ": " + range.status().message()));
  Range r{range->base, range->base + range->size};
  if (at < r.base || at > r.end || n > r.end - at)
    return Status(Code::kUnavailable,
                  fmt::format("a list's device side {} + {} B runs past its allocation on cuda:{}", p, n, device_));
  known_.push_back(r);
  return Status();
}

Result<ListCopier::Buffer> ListCopier::take(size_t descs, size_t range, uint64_t completed) {
  while (!busy_.empty() && busy_.front().fence <= completed) {
    idle_.push_back(busy_.front());
    busy_.pop_front();
  }
  for (size_t i = 0; i < idle_.size(); ++i) {
    if (idle_[i].desc_cap >= descs && idle_[i].twin_cap >= range) {
      Buffer b = idle_[i];
      idle_.erase(idle_.begin() + static_cast<ptrdiff_t>(i));
      return b;
    }
  }
  if (busy_.size() + idle_.size() >= kMaxBuffers)
    return Status(Code::kUnavailable, fmt::format("all {} list buffers of this queue are in use", kMaxBuffers));
  // Rounded up, so that a few sizes serve every list; kept until the queue goes. The twin is
  // stream-ordered memory: freeing it then waits for nothing (cudaFree waits for the device).
  // Failing to allocate enqueues no copy: the caller copies span by span.
  auto refused = [&](const char* what, cudaError_t e) {
    (void)cudaGetLastError();  // not sticky: clear it
    return Status(Code::kUnavailable, error_status(what, device_, e).message());
  };
  Buffer b;
  b.desc_cap = std::bit_ceil(std::max<size_t>(descs, 1024));
  b.twin_cap = std::bit_ceil(std::max<size_t>(range, size_t{1} << 20));
  cudaError_t e = cudaHostAlloc(reinterpret_cast<void**>(&b.descs), b.desc_cap * sizeof(SegmentCopy),
                                cudaHostAllocPortable | cudaHostAllocMapped);
  if (e != cudaSuccess) return refused("cudaHostAlloc(list descriptors)", e);
  e = cudaMallocAsync(reinterpret_cast<void**>(&b.twin), b.twin_cap, static_cast<cudaStream_t>(stream_));
  if (e != cudaSuccess) {
    (void)cudaFreeHost(b.descs);
    return refused("cudaMallocAsync(list twin)", e);
  }
  return b;
}

Status ListCopier::enqueue(const CopyQueue::Span* spans, size_t n, bool to_host, uint64_t fence, uint64_t completed) {
  if (n == 0) return Status();
  // The host range, and every device side checked, before anything is enqueued.
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  size_t descs = 0;
  known_.clear();
  for (size_t i = 0; i < n; ++i) {
    const CopyQueue::Span& s = spans[i];
    auto host = reinterpret_cast<uintptr_t>(to_host ? s.dst : s.src);
    const void* dev = to_host ? s.src : s.dst;
    if (s.n == 0) continue;
    DMX_RETURN_IF_ERROR(on_device(dev, s.n));
    lo = std::min(lo, host);
    hi = std::max(hi, host + s.n);
    descs += (s.n + kSegmentPiece - 1) / kSegmentPiece;
  }
  if (descs == 0) return Status();
  if (hi - lo > kMaxRange)
    return Status(Code::kUnavailable, fmt::format("a list over {} B of staging; at most {} B", hi - lo, kMaxRange));
  DMX_ASSIGN_OR_RETURN(Buffer b, take(descs, hi - lo, completed));
  auto twin = reinterpret_cast<uint64_t>(b.twin);
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    const CopyQueue::Span& s = spans[i];
    if (s.n == 0) continue;
    uint64_t src = reinterpret_cast<uint64_t>(s.src), dst = reinterpret_cast<uint64_t>(s.dst);
    if (to_host) dst = twin + (dst - lo);
    else src = twin + (src - lo);
    k += split_segment(src, dst, s.n, b.descs + k);
  }
  auto stream = static_cast<cudaStream_t>(stream_);
  Status s;
  void* descs_on_device = nullptr;
  cudaError_t e = cudaHostGetDevicePointer(&descs_on_device, b.descs, 0);
  if (e != cudaSuccess) s = error_status("cudaHostGetDevicePointer(list descriptors)", device_, e);
  if (s.ok() && !to_host) {
    e = cudaMemcpyAsync(b.twin, reinterpret_cast<void*>(lo), hi - lo, cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess) s = error_status(fmt::format("cudaMemcpyAsync(list, {} B to the twin)", hi - lo), device_, e);
  }
  if (s.ok()) s = launch_segment_copy(static_cast<const SegmentCopy*>(descs_on_device), k, stream);
  // Gather: one copy per run of adjacent host spans (one for a slot packed in order).
  for (size_t i = 0; s.ok() && to_host && i < n;) {
    if (spans[i].n == 0) {
      ++i;
      continue;
    }
    auto start = reinterpret_cast<uintptr_t>(spans[i].dst);
    uintptr_t end = start + spans[i].n;
    for (++i; i < n && (spans[i].n == 0 || reinterpret_cast<uintptr_t>(spans[i].dst) == end); ++i) end += spans[i].n;
    e = cudaMemcpyAsync(reinterpret_cast<void*>(start), b.twin + (start - lo), end - start, cudaMemcpyDeviceToHost,
                        stream);
    if (e != cudaSuccess) s = error_status(fmt::format("cudaMemcpyAsync(list, {} B from the twin)", end - start), device_, e);
  }
  // Busy even after an error: the kernel may have been launched.
  b.fence = fence;
  busy_.push_back(b);
  return s;
}

}  // namespace dmx::cuda
