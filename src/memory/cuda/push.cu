// The SM copy of GPU push (push.h): one grid-stride loop, 16-byte accesses when both ends are
// 16-byte aligned, bytes otherwise. Small by design: it replaces a copy-engine copy of at most
// kPushCopyMax bytes, so its launch, not its loop, is what it costs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "memory/cuda/push.h"

namespace dmx::cuda {
namespace {

constexpr int kThreads = 256;
constexpr size_t kBytesPerBlock = kThreads * 16 * 4;  // four 16-byte stores per thread per block
constexpr unsigned kMaxBlocks = 64;

__global__ void push_copy(unsigned char* __restrict__ dst, const unsigned char* __restrict__ src, size_t n) {
  const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t done = 0;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
    const size_t vecs = n / 16;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (size_t i = tid; i < vecs; i += stride) d[i] = s[i];
    done = vecs * 16;
  }
  for (size_t i = done + tid; i < n; i += stride) dst[i] = src[i];
}

}  // namespace

Status launch_push_copy(void* dst, const void* src, size_t n, void* stream) {
  if (n == 0 || n > kPushCopyMax)
    return Status(Code::kInvalidArgument, "push copy of " + std::to_string(n) + " B: 1 B to 1 MiB only");
  unsigned blocks = static_cast<unsigned>(std::min<size_t>((n + kBytesPerBlock - 1) / kBytesPerBlock, kMaxBlocks));
  push_copy<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<unsigned char*>(dst),
                                                                          static_cast<const unsigned char*>(src), n);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return Status(Code::kInternal, std::string("push copy kernel launch failed: ") + cudaGetErrorName(err) + " (" +
                                       cudaGetErrorString(err) + ")");
  return Status();
}

Status preload_push_copy() {
  cudaFuncAttributes attr{};
  cudaError_t err = cudaFuncGetAttributes(&attr, push_copy);  // loads it (CUDA guide, "Lazy Loading")
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return Status(Code::kUnavailable, std::string("the push copy kernel cannot be loaded: ") + cudaGetErrorName(err) +
                                          " (" + cudaGetErrorString(err) + ")");
  }
  return Status();
}

}  // namespace dmx::cuda
