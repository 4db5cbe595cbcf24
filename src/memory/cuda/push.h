// GPU push: a small copy made by the SMs (loads and stores from one small kernel) instead of a
// copy engine, for sizes where the copy engine's fixed cost dominates (docs/gpu-push.md). The
// stores are posted writes: into a peer GPU over NVLink, into pinned host memory over PCIe. No
// CUDA headers: CudaQueue calls it.
#pragma once

#include <cstddef>

#include "dmx/status.h"

namespace dmx::cuda {

// The largest copy launch_push_copy takes; larger ones belong to the copy engines.
inline constexpr size_t kPushCopyMax = size_t{1} << 20;

// Enqueues on `stream` (a cudaStream_t of the current device) a kernel that copies n bytes
// (1 <= n <= kPushCopyMax) from src to dst, both addressable by that device (its memory, a peer's
// with peer access on, mapped pinned host memory). Ordered with the stream's other work; the
// kernel's completion (a fence after it) makes the bytes visible to the host and other devices.
// Launch errors only.
Status launch_push_copy(void* dst, const void* src, size_t n, void* stream);

// Loads the SM copy kernel on the current device now. Under lazy loading (the default since CUDA
// 12.2) a kernel's first launch loads it, and that may wait for the device to be idle: with a
// kernel of the user's spinning until a transfer lands, the transfer's first push would wait for
// that kernel, and the kernel for the transfer. The backend preloads when it is made, before any
// such kernel can run. Errors: the kernel cannot run on this device (no image for it).
Status preload_push_copy();

}  // namespace dmx::cuda
