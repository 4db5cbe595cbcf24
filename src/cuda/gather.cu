// The gather kernel and its queue. One warp copies one fragment; warps stride over the batch.
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/gather.h"
#include "memory/cuda/runtime.h"

namespace dmx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

// Copies [s, s+n) to [d, d+n) with the widest word the two addresses' relative alignment allows.
// Loads are batched four deep per lane so each warp keeps several 512-byte lines in flight.
template <typename W>
__device__ __forceinline__ void copy_words(uint8_t* d, const uint8_t* s, uint32_t n, int lane) {
  // Head: bytes until d is W-aligned (s is then aligned too).
  uint32_t head = static_cast<uint32_t>((sizeof(W) - (reinterpret_cast<uintptr_t>(d) & (sizeof(W) - 1))) &
                                        (sizeof(W) - 1));
  head = min(head, n);
  if (lane < static_cast<int>(head)) d[lane] = s[lane];
  d += head;
  s += head;
  n -= head;
  const uint32_t words = n / sizeof(W);
  auto* dw = reinterpret_cast<W*>(d);
  const auto* sw = reinterpret_cast<const W*>(s);
  uint32_t i = lane;
  for (; i + 3 * 32 < words; i += 4 * 32) {
    W a = sw[i], b = sw[i + 32], c = sw[i + 64], e = sw[i + 96];
    dw[i] = a;
    dw[i + 32] = b;
    dw[i + 64] = c;
    dw[i + 96] = e;
  }
  for (; i < words; i += 32) dw[i] = sw[i];
  const uint32_t done = words * sizeof(W);
  for (uint32_t t = done + lane; t < n; t += 32) d[t] = s[t];
}

__device__ __forceinline__ void copy_span(uint8_t* d, const uint8_t* s, uint32_t n, int lane) {
  const uintptr_t rel = reinterpret_cast<uintptr_t>(d) ^ reinterpret_cast<uintptr_t>(s);
  if ((rel & 15) == 0) {
    copy_words<uint4>(d, s, n, lane);
  } else if ((rel & 7) == 0) {
    copy_words<uint2>(d, s, n, lane);
  } else if ((rel & 3) == 0) {
    copy_words<uint32_t>(d, s, n, lane);
  } else {
    for (uint32_t t = lane; t < n; t += 32) d[t] = s[t];
  }
}

__global__ void gather_kernel(const GatherDesc* __restrict__ descs, uint32_t n, const uint8_t* __restrict__ src,
                              uint64_t src_size, uint8_t* __restrict__ dst, uint64_t dst_size, unsigned* errors) {
  const int lane = threadIdx.x & 31;
  const uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const uint32_t nwarps = (gridDim.x * blockDim.x) >> 5;
  for (uint32_t i = warp; i < n; i += nwarps) {
    const GatherDesc g = descs[i];
    // Bounds, written so that no sum can overflow.
    if (g.src > src_size || g.len > src_size - g.src || g.dst > dst_size || g.len > dst_size - g.dst) {
      if (lane == 0) atomicAdd(errors, 1u);
      continue;
    }
    copy_span(dst + g.dst, src + g.src, g.len, lane);
  }
}

int grid_for(uint32_t n, int device) {
  static int sms[64] = {0};
  int& count = sms[device & 63];
  if (count == 0 && cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) count = 80;
  const int64_t blocks = (static_cast<int64_t>(n) + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(blocks, int64_t{count} * 16)));
}

}  // namespace

Status launch_gather(const GatherDesc* descs, uint32_t n, const void* src, uint64_t src_size, void* dst,
                     uint64_t dst_size, unsigned* errors, void* stream) {
  if (n == 0) return Status();
  int device = 0;
  DMX_CUDA_RETURN_IF_ERROR("cudaGetDevice", -1, cudaGetDevice(&device));
  gather_kernel<<<grid_for(n, device), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      descs, n, static_cast<const uint8_t*>(src), src_size, static_cast<uint8_t*>(dst), dst_size, errors);
  DMX_CUDA_RETURN_IF_ERROR("gather kernel launch", device, cudaGetLastError());
  return Status();
}

}  // namespace dmx::cuda
