// cuMem memory laid out as NCCL lays out its buffers, for tests and benchmarks (internal).
#pragma once

#include <cstddef>

#include "dmx/status.h"

namespace dmx {

// `size` bytes on `device` as NCCL allocates its buffers (ncclCuMemAlloc): one cuMemCreate
// allocation (POSIX-fd handles, GPUDirect RDMA capable where the device supports it with cuMem),
// mapped with access for `device` alone, so only `device`'s context reaches it. What a net plugin
// gets from NCCL with NCCL_NET_GDR_LEVEL set. Freed by cuda_cumem_free (backend.h). kUnavailable
// without CUDA.
Result<void*> cuda_cumem_alloc_owner_only(int device, size_t size);

}  // namespace dmx
