// The segment copy kernel (segment_copy.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "memory/cuda/segment_copy.h"

namespace dmx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
// Enough resident warps to keep every SM's memory pipes busy; more only queue.
constexpr uint64_t kMaxBlocks = 4096;

template <typename W>
__device__ __forceinline__ void copy_as(uint8_t* d, const uint8_t* s, uint64_t n, int lane) {
  // Head bytes until d is W-aligned (the caller chose W so that s then is too).
  uint64_t head = (sizeof(W) - (reinterpret_cast<uintptr_t>(d) & (sizeof(W) - 1))) & (sizeof(W) - 1);
  head = head < n ? head : n;
  if (static_cast<uint64_t>(lane) < head) d[lane] = s[lane];
  d += head;
  s += head;
  n -= head;
  const uint64_t words = n / sizeof(W);
  auto* dw = reinterpret_cast<W*>(d);
  const auto* sw = reinterpret_cast<const W*>(s);
  uint64_t i = static_cast<uint64_t>(lane);
  for (; i + 3 * 32 < words; i += 4 * 32) {
    W a = sw[i], b = sw[i + 32], c = sw[i + 64], e = sw[i + 96];
    dw[i] = a;
    dw[i + 32] = b;
    dw[i + 64] = c;
    dw[i + 96] = e;
  }
  for (; i < words; i += 32) dw[i] = sw[i];
  for (uint64_t t = words * sizeof(W) + static_cast<uint64_t>(lane); t < n; t += 32) d[t] = s[t];
}

__global__ void segment_copy_kernel(const SegmentCopy* descs, uint64_t n) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * kWarpsPerBlock;
  for (uint64_t k = blockIdx.x * uint64_t{kWarpsPerBlock} + threadIdx.x / 32; k < n; k += warps) {
    const SegmentCopy c = descs[k];
    auto* d = reinterpret_cast<uint8_t*>(c.dst);
    const auto* s = reinterpret_cast<const uint8_t*>(c.src);
    const uint64_t skew = c.src ^ c.dst;
    if ((skew & 15) == 0) copy_as<uint4>(d, s, c.len, lane);
    else if ((skew & 7) == 0) copy_as<uint2>(d, s, c.len, lane);
    else if ((skew & 3) == 0) copy_as<uint32_t>(d, s, c.len, lane);
    else copy_as<uint8_t>(d, s, c.len, lane);
  }
}

}  // namespace

Status launch_segment_copy(const SegmentCopy* descs, uint64_t n, void* stream) {
  if (n == 0) return Status();
  const uint64_t blocks = std::min<uint64_t>((n + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxBlocks);
  segment_copy_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(descs, n);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return Status(Code::kInternal, "segment copy launch (" + std::to_string(n) + " segments): " + cudaGetErrorString(e));
  return Status();
}

Status preload_segment_copy() {
  cudaFuncAttributes attr{};
  cudaError_t e = cudaFuncGetAttributes(&attr, segment_copy_kernel);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return Status(Code::kUnavailable, std::string("the segment copy kernel cannot be loaded: ") + cudaGetErrorName(e) +
                                          " (" + cudaGetErrorString(e) + ")");
  }
  return Status();
}

}  // namespace dmx::cuda
