// What issuing one 8-byte copy costs the CPU, by API, and how long until it is seen complete: the
// numbers behind the launch step of the small-message paths (docs/performance.md). One JSON line
// per method with the p50 of the issue call(s) alone ("issue_us") and of issue-to-completion
// ("total_us"), completion by polling an event.
//
//   copy_issue_probe [--iters N]
//
// Methods: device->pinned and pinned->device through the runtime (cudaMemcpyAsync with its
// direction and with cudaMemcpyDefault) and the driver (cuMemcpyDtoHAsync / cuMemcpyHtoDAsync /
// cuMemcpyAsync); with two GPUs, GPU0->GPU1 peer copies the same ways plus cudaMemcpyPeerAsync;
// and the case of the cuda_ipc path: a source that another process exported (CUDA IPC handle)
// copied into GPU1, issued on GPU1's stream and on GPU0's, by the runtime and by the driver.
// Event record and event query calls are timed alone as well. And staging copies on GPU1's stream
// issued with device 0 current, device 1 current, and device 1 set and restored around each copy.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

struct Probe {
  int iters = 2000;
  cudaEvent_t event = nullptr;

  // issue(): enqueue the copy on `s` (true when it was accepted); completion: event recorded on s.
  // before(): untimed work ahead of each issue.
  void measure(const char* method, cudaStream_t s, const std::function<bool()>& issue,
               const std::function<void()>& before = {}) {
    std::vector<double> issue_us, record_us, query_us, total_us;
    for (int i = 0; i < iters + 20; ++i) {
      if (before) before();
      auto t0 = Clock::now();
      if (!issue()) {
        std::printf("{\"method\":\"%s\",\"error\":\"%s\"}\n", method, cudaGetErrorString(cudaGetLastError()));
        return;
      }
      auto t1 = Clock::now();
      cudaEventRecord(event, s);
      auto t2 = Clock::now();
      int polls = 0;
      double first_query = 0;
      for (;;) {
        auto q0 = Clock::now();
        cudaError_t err = cudaEventQuery(event);
        if (polls++ == 0) first_query = std::chrono::duration<double, std::micro>(Clock::now() - q0).count();
        if (err != cudaErrorNotReady) break;
      }
      auto t3 = Clock::now();
      if (i < 20) continue;
      issue_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      record_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
      query_us.push_back(first_query);
      total_us.push_back(std::chrono::duration<double, std::micro>(t3 - t0).count());
    }
    std::printf(
        "{\"method\":\"%s\",\"bytes\":8,\"issue_us\":%.2f,\"event_record_us\":%.2f,\"event_query_us\":%.2f,"
        "\"total_us\":%.2f,\"total_p99_us\":%.2f}\n",
        method, pct(issue_us, 0.5), pct(record_us, 0.5), pct(query_us, 0.5), pct(total_us, 0.5), pct(total_us, 0.99));
    std::fflush(stdout);
  }
};

template <class F>
F entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess) return nullptr;
  return reinterpret_cast<F>(fn);
}

using MemcpyDtoH = CUresult (*)(void*, CUdeviceptr, size_t, CUstream);
using MemcpyHtoD = CUresult (*)(CUdeviceptr, const void*, size_t, CUstream);
using MemcpyDtoD = CUresult (*)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
using MemcpyAny = CUresult (*)(CUdeviceptr, CUdeviceptr, size_t, CUstream);

CUdeviceptr dptr(const void* p) {
  return reinterpret_cast<CUdeviceptr>(p);
}

// The exporting side of the IPC case: a child that owns an 8-byte source on GPU0.
[[noreturn]] void exporter(int to_parent, int from_parent) {
  cudaSetDevice(0);
  void* src = nullptr;
  cudaIpcMemHandle_t h{};
  if (cudaMalloc(&src, 4096) != cudaSuccess || cudaIpcGetMemHandle(&h, src) != cudaSuccess)
    std::memset(&h, 0, sizeof h);
  cudaMemset(src, 0x5a, 4096);
  cudaDeviceSynchronize();
  if (write(to_parent, &h, sizeof h) != static_cast<ssize_t>(sizeof h)) _exit(1);
  char c;
  (void)!read(from_parent, &c, 1);  // the parent is done with the memory
  _exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  Probe p;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--iters") p.iters = std::atoi(argv[i + 1]);
  // CUDA must not be initialised before fork(): start the exporter first.
  int up[2], down[2];
  if (pipe(up) != 0 || pipe(down) != 0) return 1;
  pid_t child = fork();
  if (child == 0) {
    close(up[0]);
    close(down[1]);
    exporter(up[1], down[0]);
  }
  close(up[1]);
  close(down[0]);
  auto finish = [&](int rc) {
    (void)!write(down[1], "x", 1);
    waitpid(child, nullptr, 0);
    return rc;
  };
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("{\"skipped\":\"no CUDA device\"}\n");
    return finish(0);
  }
  auto d2h = entry<MemcpyDtoH>("cuMemcpyDtoHAsync");
  auto h2d = entry<MemcpyHtoD>("cuMemcpyHtoDAsync");
  auto d2d = entry<MemcpyDtoD>("cuMemcpyDtoDAsync");
  auto any = entry<MemcpyAny>("cuMemcpyAsync");
  if (!d2h || !h2d || !d2d || !any) {
    std::printf("{\"skipped\":\"driver entry points missing\"}\n");
    return finish(0);
  }
  cudaSetDevice(0);
  cudaStream_t s0;
  cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking);
  cudaEventCreateWithFlags(&p.event, cudaEventDisableTiming);
  void* dev0 = nullptr;
  void* host = nullptr;
  cudaMalloc(&dev0, 4096);
  cudaHostAlloc(&host, 4096, cudaHostAllocDefault);
  auto cu = [](CUresult r) { return r == CUDA_SUCCESS; };
  auto rt = [](cudaError_t e) { return e == cudaSuccess; };

  p.measure("d2h_cudaMemcpyAsync_dir", s0,
            [&] { return rt(cudaMemcpyAsync(host, dev0, 8, cudaMemcpyDeviceToHost, s0)); });
  p.measure("d2h_cudaMemcpyAsync_default", s0,
            [&] { return rt(cudaMemcpyAsync(host, dev0, 8, cudaMemcpyDefault, s0)); });
  p.measure("d2h_cuMemcpyDtoHAsync", s0, [&] { return cu(d2h(host, dptr(dev0), 8, s0)); });
  p.measure("d2h_cuMemcpyAsync", s0, [&] { return cu(any(dptr(host), dptr(dev0), 8, s0)); });
  // The same copy issued by a thread that never made a device current (an engine worker), and by
  // one whose caches were just flushed by other work (4 MiB touched before each copy).
  std::thread([&] {
    p.measure("d2h_cudaMemcpyAsync_dir_fresh_thread", s0,
              [&] { return rt(cudaMemcpyAsync(host, dev0, 8, cudaMemcpyDeviceToHost, s0)); });
    cudaSetDevice(0);
    p.measure("d2h_cudaMemcpyAsync_dir_fresh_thread_setdevice", s0,
              [&] { return rt(cudaMemcpyAsync(host, dev0, 8, cudaMemcpyDeviceToHost, s0)); });
  }).join();
  {
    std::vector<char> junk(4 << 20);
    unsigned sum = 0;
    p.measure(
        "d2h_cudaMemcpyAsync_dir_cold_cache", s0,
        [&] { return rt(cudaMemcpyAsync(host, dev0, 8, cudaMemcpyDeviceToHost, s0)); },
        [&] {
          for (size_t i = 0; i < junk.size(); i += 64) sum += static_cast<unsigned char>(junk[i]++);
        });
    if (sum == 1) std::printf("\n");
  }
  p.measure("h2d_cudaMemcpyAsync_dir", s0,
            [&] { return rt(cudaMemcpyAsync(dev0, host, 8, cudaMemcpyHostToDevice, s0)); });
  p.measure("h2d_cuMemcpyHtoDAsync", s0, [&] { return cu(h2d(dptr(dev0), host, 8, s0)); });
  p.measure("h2d_cuMemcpyAsync", s0, [&] { return cu(any(dptr(dev0), dptr(host), 8, s0)); });

  if (n < 2) {
    std::printf("{\"skipped\":\"peer and IPC cases need 2 GPUs\"}\n");
    return finish(0);
  }
  cudaSetDevice(1);
  cudaStream_t s1;
  cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
  cudaEvent_t event1;
  cudaEventCreateWithFlags(&event1, cudaEventDisableTiming);
  void* dev1 = nullptr;
  cudaMalloc(&dev1, 4096);
  cudaDeviceEnablePeerAccess(0, 0);
  cudaSetDevice(0);
  cudaDeviceEnablePeerAccess(1, 0);
  // Issued on GPU0 (the source's GPU writes over the link): the current device is 0.
  p.measure("peer_cudaMemcpyPeerAsync_on0", s0, [&] { return rt(cudaMemcpyPeerAsync(dev1, 1, dev0, 0, 8, s0)); });
  p.measure("peer_cudaMemcpyAsync_default_on0", s0,
            [&] { return rt(cudaMemcpyAsync(dev1, dev0, 8, cudaMemcpyDefault, s0)); });
  p.measure("peer_cudaMemcpyAsync_d2d_on0", s0,
            [&] { return rt(cudaMemcpyAsync(dev1, dev0, 8, cudaMemcpyDeviceToDevice, s0)); });
  p.measure("peer_cuMemcpyDtoDAsync_on0", s0, [&] { return cu(d2d(dptr(dev1), dptr(dev0), 8, s0)); });
  p.measure("peer_cuMemcpyAsync_on0", s0, [&] { return cu(any(dptr(dev1), dptr(dev0), 8, s0)); });

  // Staging copies on GPU1's stream (a process whose memory is on cuda:1) from a thread whose
  // current device is 0 (a thread that never chose one), is 1, or is set to 1 and back per copy.
  // Event record and query run under the same current device, as in a stream worker.
  {
    std::swap(p.event, event1);
    auto d2h1 = [&] { return rt(cudaMemcpyAsync(host, dev1, 8, cudaMemcpyDeviceToHost, s1)); };
    auto h2d1 = [&] { return rt(cudaMemcpyAsync(dev1, host, 8, cudaMemcpyHostToDevice, s1)); };
    for (int round = 0; round < 2; ++round) {
      cudaSetDevice(0);
      p.measure("d2h_on1_current0", s1, d2h1);
      p.measure("h2d_on1_current0", s1, h2d1);
      cudaSetDevice(1);
      p.measure("d2h_on1_current1", s1, d2h1);
      p.measure("h2d_on1_current1", s1, h2d1);
      cudaSetDevice(0);
      p.measure("d2h_on1_current0_set1_and_back", s1,
                [&] { return rt(cudaSetDevice(1)) && d2h1() && rt(cudaSetDevice(0)); });
    }
    std::thread([&] {  // a fresh thread: no current device chosen yet
      p.measure("d2h_on1_fresh_thread", s1, d2h1);
      cudaSetDevice(1);
      p.measure("d2h_on1_fresh_thread_set1", s1, d2h1);
    })
        .join();
    std::swap(p.event, event1);
    cudaSetDevice(0);
  }

  // The cuda_ipc case: the exporter's GPU0 memory, opened here, copied into dev1.
  cudaIpcMemHandle_t h{};
  if (read(up[0], &h, sizeof h) != static_cast<ssize_t>(sizeof h)) return finish(1);
  cudaSetDevice(1);
  void* ipc = nullptr;
  cudaError_t oe = cudaIpcOpenMemHandle(&ipc, h, cudaIpcMemLazyEnablePeerAccess);
  if (oe != cudaSuccess) {
    std::printf("{\"method\":\"ipc\",\"error\":\"cudaIpcOpenMemHandle: %s\"}\n", cudaGetErrorString(oe));
    return finish(0);
  }
  std::swap(p.event, event1);  // an event of the issuing stream's device
  p.measure("ipc_cudaMemcpyAsync_default_on1", s1,
            [&] { return rt(cudaMemcpyAsync(dev1, ipc, 8, cudaMemcpyDefault, s1)); });
  p.measure("ipc_cudaMemcpyAsync_d2d_on1", s1,
            [&] { return rt(cudaMemcpyAsync(dev1, ipc, 8, cudaMemcpyDeviceToDevice, s1)); });
  p.measure("ipc_cuMemcpyDtoDAsync_on1", s1, [&] { return cu(d2d(dptr(dev1), dptr(ipc), 8, s1)); });
  p.measure("ipc_cuMemcpyAsync_on1", s1, [&] { return cu(any(dptr(dev1), dptr(ipc), 8, s1)); });
  // Issued on GPU0's stream (cuda_ipc_copy_by=source), with device 0 current and with device 1
  // current (what the runtime does when the caller's current device is another one).
  std::swap(p.event, event1);
  cudaSetDevice(0);
  p.measure("ipc_cudaMemcpyAsync_default_on0", s0,
            [&] { return rt(cudaMemcpyAsync(dev1, ipc, 8, cudaMemcpyDefault, s0)); });
  p.measure("ipc_cuMemcpyDtoDAsync_on0", s0, [&] { return cu(d2d(dptr(dev1), dptr(ipc), 8, s0)); });
  cudaSetDevice(1);
  p.measure("ipc_cudaMemcpyAsync_default_on0_cur1", s0,
            [&] { return rt(cudaMemcpyAsync(dev1, ipc, 8, cudaMemcpyDefault, s0)); });
  p.measure("ipc_setdevice_then_copy_on0", s0, [&] {
    return rt(cudaSetDevice(0)) && rt(cudaMemcpyAsync(dev1, ipc, 8, cudaMemcpyDefault, s0)) && rt(cudaSetDevice(1));
  });
  cudaSetDevice(1);
  cudaIpcCloseMemHandle(ipc);
  return finish(0);
}
