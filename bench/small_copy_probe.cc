// What a tiny (8-byte) device<->host copy costs, by method: the numbers behind the small-message
// latency of the staged path (docs/performance.md). Prints one JSON line per method.
//
//   small_copy_probe [--iters N] [--device D]
//
// Methods: cudaMemcpyAsync to/from pinned memory completed by polling an event, or by polling the
// stream, or by spinning on a host word the stream writes after the copy (cuStreamWriteValue32);
// synchronous cudaMemcpy; an 8-byte host->device store done by the stream itself
// (cuStreamWriteValue64: no copy engine, no SM); a one-thread kernel that copies 8 bytes; with two
// GPUs, an 8-byte peer copy; and whether the CPU can map device memory through a dmabuf (mmap of
// the fd from cuMemGetHandleForAddressRange) — if it can, small payloads need no copy engine at all.
// "prearmed": the copy is enqueued before its data is ready, behind cuStreamWaitValue32 on a host
// word; only the host's store of that word is timed (the wait armed 0, 20 or 1000 us before) —
// what a receive that arms its host->device copy when it is posted would cost once its bytes come.
#include <cuda.h>
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

cudaError_t probe_launch_copy8(const void* src, void* dst, uint32_t* flag_dev, uint32_t seq, cudaStream_t s);

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

  // Completion by a host word the stream writes after the work (no event query per poll).
  using WriteValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned);
  using WriteValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned);
  WriteValue32 write32 = nullptr;
  WriteValue64 write64 = nullptr;
  cudaDriverEntryPointQueryResult q;
  cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", reinterpret_cast<void**>(&write32), 12000, cudaEnableDefault, &q);
  cudaGetDriverEntryPointByVersion("cuStreamWriteValue64", reinterpret_cast<void**>(&write64), 12000, cudaEnableDefault, &q);
  volatile uint32_t* flag = static_cast<volatile uint32_t*>(host) + 512;  // inside the pinned page
  void* flag_dev = nullptr;
  cudaHostGetDevicePointer(&flag_dev, const_cast<uint32_t*>(flag), 0);
  uint32_t seq = 0;
  auto flag_done = [&] {
    if (write32(s, reinterpret_cast<CUdeviceptr>(flag_dev), ++seq, 0) != CUDA_SUCCESS) return false;
    while (*flag != seq) {
    }
    return true;
  };
  if (write32 == nullptr || write64 == nullptr || flag_dev == nullptr) {
    std::printf("{\"method\":\"stream_write_value\",\"error\":\"cuStreamWriteValue32/64 not available\"}\n");
  } else {
    measure("stream_flag_only", iters, [&] { return flag_done(); });
    measure("d2h_async_flag_poll", iters, [&] {
      cudaMemcpyAsync(host, dev, 8, cudaMemcpyDeviceToHost, s);
      return flag_done();
    });
    measure("h2d_async_flag_poll", iters, [&] {
      cudaMemcpyAsync(dev, host, 8, cudaMemcpyHostToDevice, s);
      return flag_done();
    });
    uint64_t value = 0x0123456789abcdefull;
    measure("h2d_write_value64_flag_poll", iters, [&] {
      if (write64(s, reinterpret_cast<CUdeviceptr>(dev), ++value, 0) != CUDA_SUCCESS) return false;
      return flag_done();
    });
    uint64_t back = 0;
    cudaMemcpy(&back, dev, 8, cudaMemcpyDeviceToHost);
    std::printf("{\"method\":\"h2d_write_value64\",\"value_landed\":%s}\n", back == value ? "true" : "false");
    using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned);
    WaitValue32 wait32 = nullptr;
    cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", reinterpret_cast<void**>(&wait32), 12000, cudaEnableDefault,
                                     &q);
    volatile uint32_t* gate = static_cast<volatile uint32_t*>(host) + 768;
    void* gate_dev = nullptr;
    cudaHostGetDevicePointer(&gate_dev, const_cast<uint32_t*>(gate), 0);
    uint32_t gate_seq = 0;
    for (int armed_us : {0, 20, 1000}) {
      for (bool by_flag : {false, true}) {
        std::string name = std::string("h2d_prearmed_") + (by_flag ? "flag" : "event") + "_poll_armed_" +
                           std::to_string(armed_us) + "us";
        // Arm outside the timed part: the wait, the copy, the completion marker.
        auto arm = [&] {
          ++gate_seq;
          if (wait32 == nullptr ||
              wait32(s, reinterpret_cast<CUdeviceptr>(gate_dev), gate_seq, CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS)
            return false;
          cudaMemcpyAsync(dev, host, 8, cudaMemcpyHostToDevice, s);
          if (by_flag) return write32(s, reinterpret_cast<CUdeviceptr>(flag_dev), ++seq, 0) == CUDA_SUCCESS;
          return cudaEventRecord(e, s) == cudaSuccess;
        };
        std::vector<double> us;
        bool ok = true;
        for (int i = 0; i < iters + 20 && ok; ++i) {
          ok = arm();
          auto until = Clock::now() + std::chrono::microseconds(armed_us);
          while (Clock::now() < until) {
          }
          auto t0 = Clock::now();
          *gate = gate_seq;
          if (by_flag) {
            while (*flag != seq) {
            }
          } else {
            spin_event();
          }
          if (i >= 20) us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        }
        if (!ok) {
          std::printf("{\"method\":\"%s\",\"error\":\"cuStreamWaitValue32 failed\"}\n", name.c_str());
          cudaStreamSynchronize(s);
          break;
        }
        std::sort(us.begin(), us.end());
        std::printf("{\"method\":\"%s\",\"bytes\":8,\"p50_us\":%.2f,\"p99_us\":%.2f}\n", name.c_str(), median(us),
                    us[us.size() * 99 / 100]);
      }
    }
    void* host_dev = nullptr;
    cudaHostGetDevicePointer(&host_dev, host, 0);
    measure("d2h_kernel_flag_poll", iters, [&] {
      return probe_launch_copy8(dev, host_dev, static_cast<uint32_t*>(flag_dev), ++seq, s) == cudaSuccess &&
             [&] { while (*flag != seq) {} return true; }();
    });
    measure("h2d_kernel_flag_poll", iters, [&] {
      return probe_launch_copy8(host_dev, dev, static_cast<uint32_t*>(flag_dev), ++seq, s) == cudaSuccess &&
             [&] { while (*flag != seq) {} return true; }();
    });
    int n = 0;
    cudaGetDeviceCount(&n);
    if (n > 1) {
      void* peer = nullptr;
      cudaSetDevice(1);
      cudaMalloc(&peer, 4096);
      cudaSetDevice(device);
      cudaDeviceEnablePeerAccess(1, 0);
      measure("d2d_peer_async_event_poll", iters, [&] {
        cudaMemcpyPeerAsync(peer, 1, dev, device, 8, s);
        cudaEventRecord(e, s);
        return spin_event();
      });
      measure("d2d_peer_async_flag_poll", iters, [&] {
        cudaMemcpyPeerAsync(peer, 1, dev, device, 8, s);
        return flag_done();
      });
      measure("d2d_peer_kernel_flag_poll", iters, [&] {
        return probe_launch_copy8(dev, peer, static_cast<uint32_t*>(flag_dev), ++seq, s) == cudaSuccess &&
               [&] { while (*flag != seq) {} return true; }();
      });
    }
  }

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
