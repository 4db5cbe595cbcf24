#include "plugins/nccl/cuda_pointer.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

namespace dmx::nccl {

Result<int> cuda_device_of(const void* ptr) {
  cudaPointerAttributes attr{};
  cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it for the next call
    return Status(Code::kUnavailable, fmt::format("cudaPointerGetAttributes({}): {}", ptr, cudaGetErrorString(e)));
  }
  if (attr.type != cudaMemoryTypeDevice)
    return Status(Code::kInvalidArgument, fmt::format("{} is not CUDA device memory (type {})", ptr, int(attr.type)));
  return attr.device;
}

}  // namespace dmx::nccl
