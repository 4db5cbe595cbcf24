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

// Picks word q+i of the 8-word window (q in 0..3, i in 0..4) without indexing a register array
// (which would spill to local memory).
__device__ __forceinline__ uint32_t pick(const uint32_t (&w)[8], uint32_t q, int i) {
  switch (q) {
    case 0: return w[i];
    case 1: return w[i + 1];
    case 2: return w[i + 2];
    default: return w[i + 3];
  }
}

// Source and destination disagree modulo 16: stores stay 16-byte and aligned; each lane loads the
// two aligned 16-byte source words that cover its output and shifts them into place
// (funnel shifts). Loads never leave [src_lo, src_hi): where the second word would, the chunk is
// copied bytewise instead.
__device__ __forceinline__ void copy_shifted(uint8_t* d, const uint8_t* s, uint32_t n, int lane,
                                             const uint8_t* src_lo, const uint8_t* src_hi) {
  uint32_t head = static_cast<uint32_t>((16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15);
  head = min(head, n);
  if (lane < static_cast<int>(head)) d[lane] = s[lane];
  d += head;
  s += head;
  n -= head;
  const uint32_t chunks = n / 16;
  const uint32_t k = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(s) & 15);
  const uint8_t* sa = s - k;
  const uint32_t q = k >> 2, r = (k & 3) * 8;
  auto* dw = reinterpret_cast<uint4*>(d);
  const auto* sw = reinterpret_cast<const uint4*>(sa);
  for (uint32_t j = lane; j < chunks; j += 32) {
    if (sa < src_lo || sa + 16 * (size_t{j} + 2) > src_hi) {
      for (int b = 0; b < 16; ++b) d[16 * j + b] = s[16 * j + b];
      continue;
    }
    const uint4 a = sw[j], b = sw[j + 1];
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    uint4 o;
    o.x = __funnelshift_r(pick(w, q, 0), pick(w, q, 1), r);
    o.y = __funnelshift_r(pick(w, q, 1), pick(w, q, 2), r);
    o.z = __funnelshift_r(pick(w, q, 2), pick(w, q, 3), r);
    o.w = __funnelshift_r(pick(w, q, 3), pick(w, q, 4), r);
    dw[j] = o;
  }
  for (uint32_t t = chunks * 16 + lane; t < n; t += 32) d[t] = s[t];
}

__device__ __forceinline__ void copy_span(uint8_t* d, const uint8_t* s, uint32_t n, int lane, const uint8_t* src_lo,
                                          const uint8_t* src_hi) {
  const uintptr_t rel = reinterpret_cast<uintptr_t>(d) ^ reinterpret_cast<uintptr_t>(s);
  if ((rel & 15) == 0) {
    copy_words<uint4>(d, s, n, lane);
  } else if (n >= 64) {
    copy_shifted(d, s, n, lane, src_lo, src_hi);
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
    copy_span(dst + g.dst, src + g.src, g.len, lane, src, src + src_size);
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
