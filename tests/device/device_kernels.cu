// The kernels of device_kernels.h: plain one-block kernels over dmx/device.cuh.
#include <cuda_runtime.h>

#include <string>

#include "dmx/device.cuh"
#include "device/device_kernels.h"

namespace dmx::test {
namespace {

constexpr int kThreads = 128;

__device__ unsigned char pattern_at(uint64_t seed, uint64_t round, uint64_t i) {
  uint64_t x = seed ^ (round * 0x9e3779b97f4a7c15ull) ^ (i * 0xbf58476d1ce4e5b9ull);
  x ^= x >> 31;
  x *= 0x94d049bb133111ebull;
  return static_cast<unsigned char>(x >> 56);
}

__device__ uint64_t clock_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void put_rounds(DeviceHandle h, unsigned char* src, uint64_t len, DeviceRemote dst, int rounds, uint64_t seed,
                           int* result) {
  for (int r = 0; r < rounds; ++r) {
    for (uint64_t i = threadIdx.x; i < len; i += blockDim.x) src[i] = pattern_at(seed, r, i);
    int64_t t = device::block_write(h, src, len, dst, r * len, true, r + 1);
    int rc = device::block_wait(h, t);
    if (rc != 0) {
      if (threadIdx.x == 0) *result = rc;
      return;
    }
  }
  if (threadIdx.x == 0) *result = 0;
}

__global__ void check_rounds(DeviceHandle h, const unsigned char* region, uint64_t len, int rounds, uint64_t seed,
                             int* result) {
  __shared__ int bad;
  for (int r = 0; r < rounds; ++r) {
    int rc = device::block_wait_notifications(h, r + 1);
    if (rc != 0) {
      if (threadIdx.x == 0) *result = rc;
      return;
    }
    if (threadIdx.x == 0) bad = 0;
    __syncthreads();
    const unsigned char* p = region + r * len;
    for (uint64_t i = threadIdx.x; i < len; i += blockDim.x)
      if (p[i] != pattern_at(seed, r, i)) atomicAdd(&bad, 1);
    __syncthreads();
    if (bad != 0) {
      if (threadIdx.x == 0) *result = 1000 + r;
      return;
    }
  }
  if (threadIdx.x == 0) *result = 0;
}

__global__ void until_failure(DeviceHandle h, unsigned char* src, DeviceRemote dst, int* result, uint64_t* elapsed_ns,
                              uint64_t* rounds_done) {
  for (uint64_t r = 0;; ++r) {
    uint64_t t0 = clock_ns();
    int64_t t = device::block_write(h, src, 8, dst, 0, true, r + 1);
    int rc = device::block_wait(h, t);
    if (rc != 0) {
      if (threadIdx.x == 0) {
        *result = rc;
        *elapsed_ns = clock_ns() - t0;
        *rounds_done = r;
      }
      return;
    }
  }
}

__global__ void ping(DeviceHandle h, unsigned char* src, DeviceRemote dst, int iters, bool pong, uint64_t* times,
                     int* result) {
  for (int i = 0; i < iters; ++i) {
    if (threadIdx.x == 0) src[0] = static_cast<unsigned char>(i);
    uint64_t t0 = clock_ns();
    int64_t t = device::block_write(h, src, 8, dst, 0, true, i + 1);
    int rc = pong ? (t < 0 ? static_cast<int>(t) : device::block_wait_notifications(h, i + 1))
                  : device::block_wait(h, t);
    uint64_t t1 = clock_ns();
    if (rc == 0 && pong) rc = device::block_wait(h, t);  // the write's own completion, before reusing src
    if (rc != 0) {
      if (threadIdx.x == 0) *result = rc;
      return;
    }
    if (threadIdx.x == 0) times[i] = t1 - t0;
  }
  if (threadIdx.x == 0) *result = 0;
}

__global__ void pong_kernel(DeviceHandle h, unsigned char* src, DeviceRemote dst, int iters, int* result) {
  for (int i = 0; i < iters; ++i) {
    int rc = device::block_wait_notifications(h, i + 1);
    int64_t t = rc == 0 ? device::block_write(h, src, 8, dst, 0, true, i + 1) : rc;
    rc = device::block_wait(h, t);
    if (rc != 0) {
      if (threadIdx.x == 0) *result = rc;
      return;
    }
  }
  if (threadIdx.x == 0) *result = 0;
}

__global__ void direct_put_rounds(DeviceHandle h, unsigned char* src, uint64_t len, DeviceWindow data,
                                  DeviceWindow signal, int rounds, uint64_t seed, int* result) {
  for (int r = 0; r < rounds; ++r) {
    for (uint64_t i = threadIdx.x; i < len; i += blockDim.x) src[i] = pattern_at(seed, r, i);
    __syncthreads();  // every byte of src written before any thread copies it out
    int rc = device::block_put_signal(h, src, len, data, r * len, signal, 0, r + 1);
    if (rc != 0) {
      if (threadIdx.x == 0) *result = rc;
      return;
    }
  }
  if (threadIdx.x == 0) *result = 0;
}

__global__ void direct_check_rounds(DeviceHandle h, const unsigned char* region, uint64_t len, const uint64_t* signal,
                                    int rounds, uint64_t seed, int* result) {
  __shared__ int bad;
  for (int r = 0; r < rounds; ++r) {
    int rc = device::block_wait_signal(h, signal, r + 1);
    if (rc != 0) {
      if (threadIdx.x == 0) *result = rc;
      return;
    }
    if (threadIdx.x == 0) bad = 0;
    __syncthreads();
    const unsigned char* p = region + r * len;
    for (uint64_t i = threadIdx.x; i < len; i += blockDim.x)
      if (p[i] != pattern_at(seed, r, i)) atomicAdd(&bad, 1);
    __syncthreads();
    if (bad != 0) {
      if (threadIdx.x == 0) *result = 1000 + r;
      return;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *result = 0;
}

// One warp. The one-sided rounds do block_put_signal's steps by hand to time each.
__global__ void direct_ping(DeviceHandle h, unsigned char* src, DeviceWindow dst, DeviceWindow signal,
                            const uint64_t* mine, int iters, bool pong, uint64_t* steps, int* result) {
  uint64_t* word = device_ring::signal_word(signal, 0);
  for (int i = 0; i < iters; ++i) {
    if (threadIdx.x == 0) src[0] = static_cast<unsigned char>(i);
    __syncwarp();
    if (pong) {
      uint64_t t0 = clock_ns();
      int rc = device::block_put_signal(h, src, 8, dst, 0, signal, 0, i + 1);
      if (rc == 0) rc = device::block_wait_signal(h, mine, i + 1);
      uint64_t t1 = clock_ns();
      if (rc != 0) {
        if (threadIdx.x == 0) *result = rc;
        return;
      }
      if (threadIdx.x == 0) steps[3 * i] = t1 - t0;
      continue;
    }
    uint64_t t0 = clock_ns();
    if (threadIdx.x == 0) *reinterpret_cast<uint64_t*>(dst.base) = *reinterpret_cast<const uint64_t*>(src);
    __threadfence_system();
    __syncwarp();
    uint64_t t1 = clock_ns();
    int64_t told = 0;
    uint64_t t2 = t1, t3 = t1;
    if (threadIdx.x == 0) {
      device_ring::store_release(word, static_cast<uint64_t>(i + 1));
      __threadfence_system();
      t2 = clock_ns();
      told = device_ring::post(h, DeviceOpKind::kDirect, 0, src, 8, 0, 0, 0, i + 1);
      t3 = clock_ns();
      steps[3 * i] = t1 - t0;
      steps[3 * i + 1] = t2 - t1;
      steps[3 * i + 2] = t3 - t2;
      if (told < 0) *result = static_cast<int>(told);
    }
    __syncwarp();
    if (__shfl_sync(0xffffffffu, told < 0 ? 1 : 0, 0)) return;
  }
  if (threadIdx.x == 0) *result = 0;
}

__global__ void direct_pong(DeviceHandle h, unsigned char* src, DeviceWindow dst, DeviceWindow signal,
                            const uint64_t* mine, int iters, int* result) {
  for (int i = 0; i < iters; ++i) {
    int rc = device::block_wait_signal(h, mine, i + 1);
    if (rc == 0) rc = device::block_put_signal(h, src, 8, dst, 0, signal, 0, i + 1);
    if (rc != 0) {
      if (threadIdx.x == 0) *result = rc;
      return;
    }
  }
  if (threadIdx.x == 0) *result = 0;
}

// flags[0]: set by the host to stop; flags[1]: 1 once running, 2 stopped when told, 3 timed out.
__global__ void spin(volatile int* flags, uint64_t max_ns) {
  uint64_t t0 = clock_ns();
  flags[1] = 1;
  __threadfence_system();
  while (flags[0] == 0) {
    if (clock_ns() - t0 > max_ns) {
      flags[1] = 3;
      return;
    }
    __nanosleep(1000);
  }
  flags[1] = 2;
}

int* spin_flags = nullptr;
cudaStream_t spin_stream = nullptr;

std::string finish(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e == cudaSuccess) return "";
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

}  // namespace

std::string run_put_rounds(const DeviceHandle& h, unsigned char* src, uint64_t len, DeviceRemote dst, int rounds,
                           uint64_t seed, int* result) {
  put_rounds<<<1, kThreads>>>(h, src, len, dst, rounds, seed, result);
  return finish("put_rounds");
}
std::string run_check_rounds(const DeviceHandle& h, const unsigned char* region, uint64_t len, int rounds,
                             uint64_t seed, int* result) {
  check_rounds<<<1, kThreads>>>(h, region, len, rounds, seed, result);
  return finish("check_rounds");
}
std::string run_until_failure(const DeviceHandle& h, unsigned char* src, DeviceRemote dst, int* result,
                              uint64_t* elapsed_ns, uint64_t* rounds_done) {
  until_failure<<<1, kThreads>>>(h, src, dst, result, elapsed_ns, rounds_done);
  return finish("until_failure");
}
std::string run_ping(const DeviceHandle& h, unsigned char* src, DeviceRemote dst, int iters, bool pong,
                     uint64_t* times_ns, int* result) {
  ping<<<1, 32>>>(h, src, dst, iters, pong, times_ns, result);
  return finish("ping");
}
std::string run_pong(const DeviceHandle& h, unsigned char* src, DeviceRemote dst, int iters, int* result) {
  pong_kernel<<<1, 32>>>(h, src, dst, iters, result);
  return finish("pong");
}

std::string run_direct_put_rounds(const DeviceHandle& h, unsigned char* src, uint64_t len, DeviceWindow data,
                                  DeviceWindow signal, int rounds, uint64_t seed, int* result) {
  direct_put_rounds<<<1, kThreads>>>(h, src, len, data, signal, rounds, seed, result);
  return finish("direct_put_rounds");
}
std::string run_direct_check_rounds(const DeviceHandle& h, const unsigned char* region, uint64_t len,
                                    const uint64_t* signal, int rounds, uint64_t seed, int* result) {
  direct_check_rounds<<<1, kThreads>>>(h, region, len, signal, rounds, seed, result);
  return finish("direct_check_rounds");
}
std::string run_direct_ping(const DeviceHandle& h, unsigned char* src, DeviceWindow dst, DeviceWindow signal,
                            const uint64_t* mine, int iters, bool pong, uint64_t* steps_ns, int* result) {
  direct_ping<<<1, 32>>>(h, src, dst, signal, mine, iters, pong, steps_ns, result);
  return finish("direct_ping");
}
std::string run_direct_pong(const DeviceHandle& h, unsigned char* src, DeviceWindow dst, DeviceWindow signal,
                            const uint64_t* mine, int iters, int* result) {
  direct_pong<<<1, 32>>>(h, src, dst, signal, mine, iters, result);
  return finish("direct_pong");
}

std::string start_spinner(uint64_t max_ns) {
  cudaError_t e = cudaSuccess;
  if (spin_flags == nullptr) e = cudaHostAlloc(reinterpret_cast<void**>(&spin_flags), 2 * sizeof(int), cudaHostAllocMapped);
  if (e == cudaSuccess && spin_stream == nullptr) e = cudaStreamCreateWithFlags(&spin_stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) return std::string("spinner set-up: ") + cudaGetErrorName(e);
  volatile int* f = spin_flags;
  f[0] = 0;
  f[1] = 0;
  spin<<<1, 32, 0, spin_stream>>>(spin_flags, max_ns);
  if ((e = cudaGetLastError()) != cudaSuccess) return std::string("spin launch: ") + cudaGetErrorName(e);
  for (int i = 0; i < 10'000'000 && f[1] == 0; ++i) {
  }
  return f[1] != 0 ? "" : "the spinner did not start";
}
std::string stop_spinner(bool* stopped) {
  volatile int* f = spin_flags;
  if (f == nullptr) return "no spinner";
  f[0] = 1;
  cudaError_t e = cudaStreamSynchronize(spin_stream);
  if (e != cudaSuccess) return std::string("spinner: ") + cudaGetErrorName(e);
  *stopped = f[1] == 2;
  return "";
}

std::string set_device(int device) {
  cudaError_t e = cudaSetDevice(device);
  return e == cudaSuccess ? "" : std::string("cudaSetDevice: ") + cudaGetErrorName(e);
}
void* device_alloc(uint64_t bytes) {
  void* p = nullptr;
  return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
}
void device_free(void* p) { (void)cudaFree(p); }
std::string copy_to_host(void* host, const void* dev, uint64_t bytes) {
  cudaError_t e = cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost);
  return e == cudaSuccess ? "" : std::string("cudaMemcpy: ") + cudaGetErrorName(e);
}
std::string copy_to_device(void* dev, const void* host, uint64_t bytes) {
  cudaError_t e = cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice);
  return e == cudaSuccess ? "" : std::string("cudaMemcpy: ") + cudaGetErrorName(e);
}

}  // namespace dmx::test
