// What a tiny (8-byte) device<->host copy costs, by method: the numbers behind the small-message
// latency of the staged path (docs/performance.md). Prints one JSON line per method.
//
//   small_copy_probe [--iters N] [--device D]
//
// Methods: cudaMemcpyAsync to/from pinned memory completed by polling an event, or by polling the
// stream; synchronous cudaMemcpy; and whether the CPU can map device memory through a dmabuf
// (mmap of the fd from cuMemGetHandleForAddressRange) — if it can, small payloads need no copy
// engine at all.
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "memory/cuda/driver.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

template <class F>
void measure(const char* method, int iters, F&& once) {
  std::vector<double> us;
  for (int i = 0; i < iters + 20; ++i) {
    auto t0 = Clock::now();
    if (!once()) {
      std::printf("{\"method\":\"%s\",\"error\":\"failed\"}\n", method);
      return;
    }
    if (i >= 20) us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  std::printf("{\"method\":\"%s\",\"bytes\":8,\"p50_us\":%.2f,\"p99_us\":%.2f}\n", method, median(us),
              us[us.size() * 99 / 100]);
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 2000, device = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--iters") iters = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--device") device = std::atoi(argv[i + 1]);
  }
  if (cudaSetDevice(device) != cudaSuccess) {
    std::printf("{\"skipped\":\"no CUDA device %d\"}\n", device);
    return 0;
  }
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEvent_t e;
  cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  void* dev = nullptr;
  void* host = nullptr;
  const size_t kMap = 2 << 20;
  cudaMalloc(&dev, kMap);
  cudaHostAlloc(&host, 4096, cudaHostAllocDefault);
  auto spin_event = [&] {
    while (cudaEventQuery(e) == cudaErrorNotReady) {
    }
    return true;
  };
  measure("d2h_async_event_poll", iters, [&] {
    cudaMemcpyAsync(host, dev, 8, cudaMemcpyDeviceToHost, s);
    cudaEventRecord(e, s);
    return spin_event();
  });
  measure("h2d_async_event_poll", iters, [&] {
    cudaMemcpyAsync(dev, host, 8, cudaMemcpyHostToDevice, s);
    cudaEventRecord(e, s);
    return spin_event();
  });
  measure("d2h_async_stream_poll", iters, [&] {
    cudaMemcpyAsync(host, dev, 8, cudaMemcpyDeviceToHost, s);
    while (cudaStreamQuery(s) == cudaErrorNotReady) {
    }
    return true;
  });
  measure("d2h_sync_memcpy", iters, [&] { return cudaMemcpy(host, dev, 8, cudaMemcpyDeviceToHost) == cudaSuccess; });
  measure("h2d_sync_memcpy", iters, [&] { return cudaMemcpy(dev, host, 8, cudaMemcpyHostToDevice) == cudaSuccess; });

  int fd = -1;
  auto err = dmx::cuda::driver::get_dmabuf_fd(dev, kMap, false, &fd);
  if (fd < 0) {
    std::printf("{\"method\":\"dmabuf_mmap\",\"error\":\"no dmabuf fd: %s\"}\n", err.text.c_str());
  } else {
    void* p = mmap(nullptr, kMap, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      std::printf("{\"method\":\"dmabuf_mmap\",\"error\":\"mmap: %s\"}\n", std::strerror(errno));
    } else {
      volatile uint64_t* w = static_cast<volatile uint64_t*>(p);
      *w = 0x1122334455667788ull;
      uint64_t back = 0;
      cudaMemcpy(&back, dev, 8, cudaMemcpyDeviceToHost);
      std::printf("{\"method\":\"dmabuf_mmap\",\"cpu_write_seen_by_gpu\":%s}\n", back == 0x1122334455667788ull ? "true" : "false");
      measure("dmabuf_mmap_cpu_read", iters, [&] { return *w != 1; });
      munmap(p, kMap);
    }
    close(fd);
  }
  return 0;
}
