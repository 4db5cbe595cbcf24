// CUDA runtime helpers shared by the CUDA memory code (internal; CUDA builds only).
//
// Every CUDA runtime call that can fail is turned into a Status naming the call, the device and
// the CUDA error name and text, e.g.
//   "cudaMalloc(67108867 B) on cuda:0 failed: cudaErrorMemoryAllocation (out of memory)".
// The runtime is linked statically (CUDA::cudart_static), so these helpers work, and report
// errors, on machines with no driver; driver-API calls live in cuda/driver.h only.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

#include "dmx/status.h"

namespace dmx::cuda {

// "cudaErrorInvalidValue (invalid argument)"
std::string error_text(cudaError_t err);

// The dmx code for a CUDA runtime error: out of memory -> kResourceExhausted, no driver/device ->
// kUnavailable, bad arguments -> kInvalidArgument, everything else (device faults) -> kIo.
Code error_code(cudaError_t err);

// Status for a failed call: "<call> on cuda:<device> failed: <name> (<text>)". device < 0 means
// the call concerns no particular device.
Status error_status(std::string_view call, int device, cudaError_t err);

#define DMX_CUDA_RETURN_IF_ERROR(call_text, device, expr)                                     \
  do {                                                                                      \
    cudaError_t dmx_cuda_err_ = (expr);                                                     \
    if (dmx_cuda_err_ != cudaSuccess) return ::dmx::cuda::error_status(call_text, device, dmx_cuda_err_); \
  } while (0)

// Makes `device` (and its primary context) current for the calling thread for the guard's
// lifetime and restores the caller's device afterwards. Costs two thread-local runtime calls.
// The copy hot path uses a driver::ContextGuard instead (copies need their device's context
// current for cuMem memory, and restoring "no context" must not create device 0's);
// cudaEventRecord/cudaEventQuery need neither. Check status() before relying on it.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;  // -1: nothing to restore
  Status status_;
};

// Number of usable CUDA devices, probed once per process; Code::kUnavailable with the exact
// reason (driver missing, driver older than the runtime, no device, ...) when there are none.
Result<int> device_count();

// Ok when `device` names a usable device, else kUnavailable ("cuda:3: no such device (...)").
Status check_device(int device);

}  // namespace dmx::cuda
