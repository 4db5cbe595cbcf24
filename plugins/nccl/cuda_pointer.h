// cuda_pointer.h — which CUDA device owns a pointer NCCL registers as NCCL_PTR_CUDA.
//
// The one place the plugin asks CUDA anything (cuda_pointer.cc, CUDA builds; a stub otherwise).
#pragma once

#include "dmx/status.h"

namespace dmx::nccl {

// The device ordinal of CUDA device memory at `ptr`; kInvalidArgument when it is not device
// memory, kUnavailable without CUDA (the build or the driver).
Result<int> cuda_device_of(const void* ptr);

}  // namespace dmx::nccl
