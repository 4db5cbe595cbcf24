// CRC32C of device memory on the GPU (core/crc32c.h's polynomial and raw form), for the on-path
// checksum of chunks that land in or leave from CUDA memory. No CUDA headers: CudaQueue calls it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dmx/status.h"

namespace dmx::cuda {

// Enqueues on `stream` (a cudaStream_t of the current device): *scratch (device memory) ^= the raw
// CRC32C of [data, data + n), by all SMs. Launch errors only.
Status launch_crc32c(const void* data, size_t n, uint32_t* scratch, void* stream);

// Loads the CRC kernel on the current device now (as preload_push_copy in push.h, and why).
Status preload_crc32c();

}  // namespace dmx::cuda
