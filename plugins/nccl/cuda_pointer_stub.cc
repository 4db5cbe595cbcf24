#include <fmt/format.h>

#include "plugins/nccl/cuda_pointer.h"

namespace dmx::nccl {

Result<int> cuda_device_of(const void* ptr) {
  return Status(Code::kUnavailable, fmt::format("{}: this dmx was built without CUDA", ptr));
}

}  // namespace dmx::nccl
