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

}  // namespace dmx::cuda
