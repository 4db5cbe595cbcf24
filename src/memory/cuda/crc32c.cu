// The raw CRC32C of a device buffer, by many threads at once.
//
// The buffer is cut into 16-byte pieces aligned to memory (the bytes before the buffer in its
// first piece are masked to zero: leading zeros do not change a raw CRC), plus a tail of fewer than
// 16 bytes. Thread g of G takes pieces g, g + G, ... (so a warp reads 512 contiguous bytes) and
// runs Horner's rule over them: acc = acc * x^(8 * 16 G) + raw(piece), both by table lookups in
// shared memory. Each thread then moves its acc to the buffer's end and XORs it into the result:
// raw CRCs of disjoint pieces, each moved to the end, add up to the raw CRC of the whole.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "core/crc32c.h"
#include "memory/cuda/crc32c.h"

namespace dmx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr uint64_t kPiecesPerThread = 8;  // a 1 MiB chunk: 32 blocks; fewer pieces each would spend more joining than reading

struct Params {
  uint32_t powers[64];  // x^(2^k) modulo the polynomial
  uint32_t stride_op;   // x^(8 * 16 G)
};

__device__ uint32_t multiply(uint32_t a, uint32_t b) {
  uint32_t r = 0;
  for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) r ^= b;
    b = (b & 1) ? (b >> 1) ^ crc32c::kPoly : b >> 1;
  }
  return r;
}

__device__ uint32_t zeros_operator(const Params& p, uint64_t n) {
  uint32_t r = 1u << 31;
  for (unsigned k = 3; n != 0; n >>= 1, ++k)
    if (n & 1) r = multiply(p.powers[k & 63], r);
  return r;
}

__global__ void crc32c_kernel(const unsigned char* base, uint64_t lead, uint64_t full, const unsigned char* tail,
                              uint32_t tail_len, Params p, uint32_t* out) {
  __shared__ uint32_t t[16][256];    // t[k][b]: raw CRC of byte b then k zero bytes
  __shared__ uint32_t step[4][256];  // step[k][b]: (b << 8k) * stride_op
  for (uint32_t b = threadIdx.x; b < 256; b += blockDim.x) {
    uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (crc32c::kPoly & (0u - (c & 1)));
    t[0][b] = c;
    for (int k = 0; k < 4; ++k) step[k][b] = multiply(p.stride_op, b << (8 * k));
  }
  __syncthreads();
  for (uint32_t b = threadIdx.x; b < 256; b += blockDim.x)
    for (int k = 1; k < 16; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  __syncthreads();

  const uint64_t g = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
  const uint64_t stride = gridDim.x * uint64_t{blockDim.x};
  uint32_t acc = 0;
  uint64_t last = 0;
  bool any = false;
  for (uint64_t j = g; j < full; j += stride) {
    uint4 v = reinterpret_cast<const uint4*>(base)[j];
    if (j == 0 && lead != 0) {  // bytes before the buffer: zero
      uint32_t* w = reinterpret_cast<uint32_t*>(&v);
      for (uint64_t i = 0; i < lead; ++i) w[i / 4] &= ~(0xffu << (8 * (i % 4)));
    }
    uint32_t x = acc;
    acc = step[0][x & 0xff] ^ step[1][(x >> 8) & 0xff] ^ step[2][(x >> 16) & 0xff] ^ step[3][x >> 24];
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int k = 15 - 4 * i;  // byte 4i + q is followed by 15 - 4i - q bytes in the piece
      acc ^= t[k][w[i] & 0xff] ^ t[k - 1][(w[i] >> 8) & 0xff] ^ t[k - 2][(w[i] >> 16) & 0xff] ^ t[k - 3][w[i] >> 24];
    }
    last = j;
    any = true;
  }
  if (any) acc = multiply(zeros_operator(p, 16 * (full - 1 - last) + tail_len), acc);
  if (g == 0)
    for (uint32_t i = 0; i < tail_len; ++i) {
      uint32_t c = t[0][tail[i]];  // byte i of the tail, then tail_len - 1 - i bytes
      acc ^= multiply(zeros_operator(p, tail_len - 1 - i), c);
    }
  for (int off = 16; off > 0; off >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, off);
  if ((threadIdx.x & 31) == 0 && acc != 0) atomicXor(out, acc);
}

const Params& base_params() {
  static const Params p = [] {
    Params q{};
    q.powers[0] = 1u << 30;
    for (int k = 1; k < 64; ++k) q.powers[k] = crc32c::multiply(q.powers[k - 1], q.powers[k - 1]);
    return q;
  }();
  return p;
}

}  // namespace

Status launch_crc32c(const void* data, size_t n, uint32_t* scratch, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (n == 0) return Status();  // the raw CRC of nothing is 0: nothing to add
  const auto addr = reinterpret_cast<uintptr_t>(data);
  const uintptr_t aligned = addr & ~uintptr_t{15};
  const uint64_t lead = addr - aligned;
  const uint64_t full = (lead + n) / 16;
  const uintptr_t tail = std::max<uintptr_t>(addr, aligned + 16 * full);
  const auto tail_len = static_cast<uint32_t>(addr + n - tail);

  static const int sms = [] {
    int dev = 0, count = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 80;
    return count;
  }();
  const uint64_t want = (full + kPiecesPerThread - 1) / kPiecesPerThread;
  const uint64_t blocks = std::clamp<uint64_t>((want + kThreads - 1) / kThreads, 1, uint64_t(sms) * 8);
  Params p = base_params();
  p.stride_op = crc32c::zeros_operator(16 * blocks * kThreads);
  crc32c_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(reinterpret_cast<const unsigned char*>(aligned), lead,
                                                                   full, reinterpret_cast<const unsigned char*>(tail),
                                                                   tail_len, p, scratch);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return Status(Code::kInternal, std::string("crc32c kernel launch: ") + cudaGetErrorString(err));
  return Status();
}

Status preload_crc32c() {
  cudaFuncAttributes attr{};
  cudaError_t err = cudaFuncGetAttributes(&attr, crc32c_kernel);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return Status(Code::kUnavailable, std::string("the crc32c kernel cannot be loaded: ") + cudaGetErrorString(err));
  }
  return Status();
}

}  // namespace dmx::cuda
