#include "memory/cuda/event_pool.h"

#include "memory/cuda/runtime.h"

namespace dmx::cuda {

Result<cudaEvent_t> EventPool::create_locked() {
  DeviceGuard guard(device_);
  DMX_RETURN_IF_ERROR(guard.status());
  cudaEvent_t ev = nullptr;
  DMX_CUDA_RETURN_IF_ERROR("cudaEventCreateWithFlags(cudaEventDisableTiming)", device_,
                           cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  ++created_;
  return ev;
}

Status EventPool::reserve(size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  while (free_.size() < n) {
    DMX_ASSIGN_OR_RETURN(cudaEvent_t ev, create_locked());
    free_.push_back(ev);
  }
  return Status();
}

Result<cudaEvent_t> EventPool::acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) return create_locked();
  cudaEvent_t ev = free_.back();
  free_.pop_back();
  return ev;
}

void EventPool::release(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(event);
}

size_t EventPool::created() const {
  std::lock_guard<std::mutex> lock(mu_);
  return created_;
}

size_t EventPool::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_.size();
}

}  // namespace dmx::cuda
