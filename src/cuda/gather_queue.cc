// GatherQueue and the small helpers: host code around the gather kernel (gather.cu).
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "cuda/gather.h"
#include "memory/cuda/runtime.h"

namespace dmx::cuda {

// --- GatherQueue ------------------------------------------------------------------------------

struct GatherQueue::Impl {
  static constexpr int kSlots = 8;
  static constexpr uint32_t kSlotDescs = 8192;  // 8192 x 4 KiB = 32 MiB of fragments per launch
  struct Slot {
    GatherDesc* host = nullptr;  // pinned
    GatherDesc* dev = nullptr;
    cudaEvent_t event = nullptr;
    uint64_t fence = 0;  // the fence last recorded on this slot's event
    // Whether that event follows the *last* batch of its fence. A large enqueue spans several
    // slots under one fence; only its last slot's event says the whole fence has finished.
    bool last = true;
  };
  cudaStream_t stream = nullptr;
  Slot slots[kSlots];
  unsigned* dev_errors = nullptr;
  unsigned* host_errors = nullptr;  // pinned mirror, copied after each launch
  uint64_t next_fence = 1;
  uint64_t completed = 0;  // every fence <= completed has finished
  int next_slot = 0;
};

GatherQueue::GatherQueue(int device, std::unique_ptr<Impl> impl) : device_(device), impl_(std::move(impl)) {}

GatherQueue::~GatherQueue() {
  if (!impl_) return;
  DeviceGuard guard(device_);
  if (impl_->stream) cudaStreamSynchronize(impl_->stream);
  for (auto& s : impl_->slots) {
    if (s.host) cudaFreeHost(s.host);
    if (s.dev) cudaFree(s.dev);
    if (s.event) cudaEventDestroy(s.event);
  }
  if (impl_->dev_errors) cudaFree(impl_->dev_errors);
  if (impl_->host_errors) cudaFreeHost(impl_->host_errors);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

Result<std::unique_ptr<GatherQueue>> GatherQueue::create(int device) {
  DMX_RETURN_IF_ERROR(check_device(device));
  DeviceGuard guard(device);
  DMX_RETURN_IF_ERROR(guard.status());
  auto impl = std::make_unique<Impl>();
  std::unique_ptr<GatherQueue> q(new GatherQueue(device, std::move(impl)));
  Impl& m = *q->impl_;
  DMX_CUDA_RETURN_IF_ERROR("cudaStreamCreateWithFlags", device, cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
  for (auto& s : m.slots) {
    size_t bytes = sizeof(GatherDesc) * Impl::kSlotDescs;
    DMX_CUDA_RETURN_IF_ERROR("cudaMallocHost(gather descriptors)", device,
                             cudaMallocHost(reinterpret_cast<void**>(&s.host), bytes));
    DMX_CUDA_RETURN_IF_ERROR("cudaMalloc(gather descriptors)", device, cudaMalloc(reinterpret_cast<void**>(&s.dev), bytes));
    DMX_CUDA_RETURN_IF_ERROR("cudaEventCreateWithFlags", device, cudaEventCreateWithFlags(&s.event, cudaEventDisableTiming));
  }
  DMX_CUDA_RETURN_IF_ERROR("cudaMalloc(gather errors)", device, cudaMalloc(reinterpret_cast<void**>(&m.dev_errors), sizeof(unsigned)));
  DMX_CUDA_RETURN_IF_ERROR("cudaMallocHost(gather errors)", device,
                           cudaMallocHost(reinterpret_cast<void**>(&m.host_errors), sizeof(unsigned)));
  *m.host_errors = 0;
  DMX_CUDA_RETURN_IF_ERROR("cudaMemset", device, cudaMemset(m.dev_errors, 0, sizeof(unsigned)));
  return q;
}

Result<uint64_t> GatherQueue::enqueue(const void* src, uint64_t src_size, void* dst, uint64_t dst_size,
                                      std::span<const GatherDesc> descs, std::span<const HostCopy> host_copies) {
  Impl& m = *impl_;
  DeviceGuard guard(device_);
  DMX_RETURN_IF_ERROR(guard.status());
  auto* out = static_cast<uint8_t*>(dst);
  for (const auto& c : host_copies) {
    if (c.dst > dst_size || c.len > dst_size - c.dst)
      return Status(Code::kOutOfRange, fmt::format("gather: host copy dst {} len {} outside {}", c.dst, c.len, dst_size));
    DMX_CUDA_RETURN_IF_ERROR("cudaMemcpyAsync(linear chunk)", device_,
                             cudaMemcpyAsync(out + c.dst, c.host, c.len, cudaMemcpyHostToDevice, m.stream));
  }
  size_t at = 0;
  do {  // at least one slot, so that even an empty batch gets a fence
    Impl::Slot& s = m.slots[m.next_slot];
    m.next_slot = (m.next_slot + 1) % Impl::kSlots;
    if (s.fence > m.completed) {  // the slot's descriptors may still be read by the GPU
      DMX_CUDA_RETURN_IF_ERROR("cudaEventSynchronize", device_, cudaEventSynchronize(s.event));
      if (s.last) m.completed = std::max(m.completed, s.fence);
    }
    const uint32_t n = static_cast<uint32_t>(std::min<size_t>(descs.size() - at, Impl::kSlotDescs));
    if (n) {
      std::copy_n(descs.data() + at, n, s.host);
      DMX_CUDA_RETURN_IF_ERROR("cudaMemcpyAsync(descriptors)", device_,
                               cudaMemcpyAsync(s.dev, s.host, n * sizeof(GatherDesc), cudaMemcpyHostToDevice, m.stream));
      DMX_RETURN_IF_ERROR(launch_gather(s.dev, n, src, src_size, dst, dst_size, m.dev_errors, m.stream));
      DMX_CUDA_RETURN_IF_ERROR("cudaMemcpyAsync(errors)", device_,
                               cudaMemcpyAsync(m.host_errors, m.dev_errors, sizeof(unsigned), cudaMemcpyDeviceToHost, m.stream));
    }
    at += n;
    s.fence = m.next_fence;
    s.last = at >= descs.size();
    DMX_CUDA_RETURN_IF_ERROR("cudaEventRecord", device_, cudaEventRecord(s.event, m.stream));
  } while (at < descs.size());
  return m.next_fence++;
}

Result<bool> GatherQueue::done(uint64_t fence) {
  Impl& m = *impl_;
  if (fence > m.completed) {
    // Fences complete in order; the slot holding `fence` (or a later one) answers for it.
    for (auto& s : m.slots) {
      if (!s.last || s.fence < fence || s.fence <= m.completed) continue;
      cudaError_t e = cudaEventQuery(s.event);
      if (e == cudaErrorNotReady) continue;
      if (e != cudaSuccess) return error_status("cudaEventQuery(gather)", device_, e);
      m.completed = std::max(m.completed, s.fence);
    }
    if (fence > m.completed) return false;
  }
  if (unsigned bad = *static_cast<volatile unsigned*>(m.host_errors); bad != 0)
    return Status(Code::kOutOfRange, fmt::format("GPU gather on cuda:{} rejected {} out-of-bounds fragments", device_, bad));
  return true;
}

Status GatherQueue::wait(uint64_t fence, Deadline deadline) {
  auto spin_until = Clock::now() + std::chrono::microseconds(200);
  for (;;) {
    DMX_ASSIGN_OR_RETURN(bool ok, done(fence));
    if (ok) return Status();
    if (deadline.expired())
      return Status(Code::kTimeout, fmt::format("GPU gather on cuda:{} not finished by the deadline", device_));
    if (Clock::now() > spin_until) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

Result<void*> GatherQueue::alloc_pinned(size_t size) {
  DeviceGuard guard(device_);
  void* p = nullptr;
  DMX_CUDA_RETURN_IF_ERROR(fmt::format("cudaMallocHost({} B)", size), device_, cudaMallocHost(&p, size ? size : 1));
  return p;
}
void GatherQueue::free_pinned(void* p) {
  if (p) cudaFreeHost(p);
}

Result<void*> device_alloc(int device, size_t size) {
  DMX_RETURN_IF_ERROR(check_device(device));
  DeviceGuard guard(device);
  void* p = nullptr;
  DMX_CUDA_RETURN_IF_ERROR(fmt::format("cudaMalloc({} B)", size), device, cudaMalloc(&p, size));
  return p;
}
void device_free(void* p) {
  if (p) cudaFree(p);
}
Status copy_to_device(void* dst, const void* src, size_t n) {
  DMX_CUDA_RETURN_IF_ERROR("cudaMemcpy(H2D)", -1, cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy may return before the DMA has reached the device; work on
  // other (non-blocking) streams must not see the old bytes.
  DMX_CUDA_RETURN_IF_ERROR("cudaStreamSynchronize", -1, cudaStreamSynchronize(nullptr));
  return Status();
}
Status copy_to_host(void* dst, const void* src, size_t n) {
  DMX_CUDA_RETURN_IF_ERROR("cudaMemcpy(D2H)", -1, cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
  return Status();
}
Status device_memset(void* dst, int value, size_t n) {
  DMX_CUDA_RETURN_IF_ERROR("cudaMemset", -1, cudaMemset(dst, value, n));
  // cudaMemset is asynchronous and runs on the legacy stream, which does not order against the
  // gather queue's non-blocking stream: wait, or a later gather can be overwritten (seen on H200).
  DMX_CUDA_RETURN_IF_ERROR("cudaStreamSynchronize", -1, cudaStreamSynchronize(nullptr));
  return Status();
}

}  // namespace dmx::cuda
