// Tiny kernels for small_copy_probe: what moving 8 bytes with one GPU thread costs (launch plus
// completion), for comparison with a copy-engine copy of the same 8 bytes.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace {

// Copies 8 bytes, then publishes `seq` to a host-mapped flag after the data is visible system-wide.
__global__ void copy8_and_flag(const uint64_t* src, uint64_t* dst, volatile uint32_t* flag, uint32_t seq) {
  *dst = *src;
  __threadfence_system();
  *flag = seq;
}

}  // namespace

cudaError_t probe_launch_copy8(const void* src, void* dst, uint32_t* flag_dev, uint32_t seq, cudaStream_t s) {
  copy8_and_flag<<<1, 1, 0, s>>>(static_cast<const uint64_t*>(src), static_cast<uint64_t*>(dst), flag_dev, seq);
  return cudaGetLastError();
}
