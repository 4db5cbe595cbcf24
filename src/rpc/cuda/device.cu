// The service's kernels, the CPU-launched batch kernel and the persistent doorbell kernel.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "rpc/cuda/device.h"
#include "rpc/service.h"

namespace dmx::rpc::device {
namespace {

constexpr uint32_t kMaxBatch = 64;
constexpr int kThreads = 256;

struct Batch {
  Item items[kMaxBatch];
};

__constant__ MlpWeights c_w;

Status cuda_error(const char* call, cudaError_t e) {
  return Status(Code::kUnavailable, std::string("rpc: ") + call + ": " + cudaGetErrorString(e));
}

// One block computes one item; vecop's bytes equal run_host's exactly.
__device__ void compute(const Item& it) {
  const unsigned char* in = static_cast<const unsigned char*>(it.in);
  unsigned char* out = static_cast<unsigned char*>(it.out);
  if (it.method == static_cast<uint8_t>(Method::kVecop)) {
    for (uint32_t i = threadIdx.x; i < it.len; i += blockDim.x)
      out[i] = static_cast<unsigned char>(in[i] * 7u + i * 131u + 17u);
    return;
  }
  uint32_t samples = it.len / kMlpSampleIn;  // pool slots are 256-byte aligned: float loads are too
  for (uint32_t s = threadIdx.x; s < samples; s += blockDim.x) {
    const float* x = reinterpret_cast<const float*>(in + s * kMlpSampleIn);
    float* y = reinterpret_cast<float*>(out + s * kMlpSampleOut);
    float h[kMlpHidden];
    for (int j = 0; j < kMlpHidden; ++j) {
      float a = c_w.b1[j];
      for (int i = 0; i < kMlpIn; ++i) a += c_w.w1[j][i] * x[i];
      h[j] = a > 0 ? a : 0;
    }
    for (int k = 0; k < kMlpOut; ++k) {
      float a = c_w.b2[k];
      for (int j = 0; j < kMlpHidden; ++j) a += c_w.w2[k][j] * h[j];
      y[k] = a;
    }
  }
}

__global__ void batch_kernel(Batch b) { compute(b.items[blockIdx.x]); }

// The graph's kernel: its item table is in device memory, copied there by the graph's first node.
__global__ void table_kernel(const Batch* b) { compute(b->items[blockIdx.x]); }

// The doorbell rings, in mapped pinned host memory: the CPU produces `entries`, the GPU `done`.
struct Rings {
  volatile uint32_t head;  // CPU: slots rung so far
  uint32_t pad0[31];
  volatile uint32_t done_head;  // GPU: slots completed so far
  uint32_t pad1[31];
  volatile uint32_t stop;
  uint32_t pad2[31];
};

__global__ void persistent_kernel(Rings* r, volatile uint32_t* entries, volatile uint32_t* done_entries,
                                  const volatile Item* items, uint32_t cap) {
  __shared__ uint32_t s_slot;
  __shared__ int s_stop;
  uint32_t tail = 0;
  for (;;) {
    if (threadIdx.x == 0) {
      s_stop = 0;
      while (r->head == tail) {
        if (r->stop) {
          s_stop = 1;
          break;
        }
        __nanosleep(256);
      }
      if (!s_stop) {
        __threadfence_system();  // the entry and the item were written before the head
        s_slot = entries[tail % cap];
      }
    }
    __syncthreads();
    if (s_stop) return;
    Item it;
    it.in = const_cast<const void*>(items[s_slot].in);
    it.out = const_cast<void*>(items[s_slot].out);
    it.len = items[s_slot].len;
    it.method = items[s_slot].method;
    compute(it);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence_system();  // the response bytes before the completion
      done_entries[tail % cap] = s_slot;
      __threadfence_system();
      r->done_head = tail + 1;
    }
    ++tail;
    __syncthreads();
  }
}

Status wait_event(cudaEvent_t ev, Duration timeout) {
  auto deadline = std::chrono::steady_clock::now() + std::min<Duration>(timeout, std::chrono::hours(24));
  for (int spins = 0;; ++spins) {
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return Status();
    if (e != cudaErrorNotReady) return cuda_error("kernel", e);
    if (std::chrono::steady_clock::now() > deadline)
      return Status(Code::kTimeout, "rpc: kernel did not finish in time");
    if (spins > 2000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    else std::this_thread::yield();
  }
}

Status upload_weights(int device) {
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return cuda_error("cudaSetDevice", e);
  if (cudaError_t e = cudaMemcpyToSymbol(c_w, &mlp_weights(), sizeof(MlpWeights)); e != cudaSuccess)
    return cuda_error("cudaMemcpyToSymbol(weights)", e);
  return Status();
}

class LauncherImpl final : public Launcher {
 public:
  LauncherImpl(int device, bool graphs) : device_(device), graphs_(graphs) {}
  ~LauncherImpl() override {
    for (cudaGraphExec_t g : execs_)
      if (g) cudaGraphExecDestroy(g);
    if (table_host_) cudaFreeHost(table_host_);
    if (table_dev_) cudaFree(table_dev_);
    if (ev_) cudaEventDestroy(ev_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  Status init() {
    DMX_RETURN_IF_ERROR(upload_weights(device_));
    // Non-blocking: never serialised behind the legacy default stream.
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess)
      return cuda_error("cudaStreamCreate", e);
    if (cudaError_t e = cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming); e != cudaSuccess)
      return cuda_error("cudaEventCreate", e);
    if (graphs_) {
      if (cudaError_t e = cudaHostAlloc(&table_host_, sizeof(Batch), cudaHostAllocDefault); e != cudaSuccess)
        return cuda_error("cudaHostAlloc(item table)", e);
      if (cudaError_t e = cudaMalloc(&table_dev_, sizeof(Batch)); e != cudaSuccess)
        return cuda_error("cudaMalloc(item table)", e);
    }
    return Status();
  }
  Status run(const Item* items, uint32_t n, Duration timeout) override {
    cudaSetDevice(device_);
    for (uint32_t done = 0; done < n;) {
      uint32_t k = std::min(n - done, kMaxBatch);
      if (graphs_) {
        DMX_RETURN_IF_ERROR(replay(items + done, k, timeout));
      } else {
        Batch b{};
        std::memcpy(b.items, items + done, k * sizeof(Item));
        batch_kernel<<<k, kThreads, 0, stream_>>>(b);
        if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("kernel launch", e);
      }
      done += k;
    }
    if (graphs_) return Status();
    if (cudaError_t e = cudaEventRecord(ev_, stream_); e != cudaSuccess) return cuda_error("cudaEventRecord", e);
    return wait_event(ev_, timeout);
  }

 private:
  // Replays the graph of `k` items over the table, and waits: the table is reused by the next batch.
  Status replay(const Item* items, uint32_t k, Duration timeout) {
    if (!execs_[k]) DMX_RETURN_IF_ERROR(capture(k));
    std::memcpy(table_host_->items, items, k * sizeof(Item));
    if (cudaError_t e = cudaGraphLaunch(execs_[k], stream_); e != cudaSuccess) return cuda_error("cudaGraphLaunch", e);
    if (cudaError_t e = cudaEventRecord(ev_, stream_); e != cudaSuccess) return cuda_error("cudaEventRecord", e);
    return wait_event(ev_, timeout);
  }
  // Captures, once per batch size, the table's copy to the device and the kernel over it.
  Status capture(uint32_t k) {
    cudaGraph_t g = nullptr;
    if (cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal); e != cudaSuccess)
      return cuda_error("cudaStreamBeginCapture", e);
    cudaMemcpyAsync(table_dev_, table_host_, k * sizeof(Item), cudaMemcpyHostToDevice, stream_);
    table_kernel<<<k, kThreads, 0, stream_>>>(table_dev_);
    cudaError_t launched = cudaGetLastError();
    cudaError_t ended = cudaStreamEndCapture(stream_, &g);
    if (launched != cudaSuccess) return cuda_error("graph capture (kernel)", launched);
    if (ended != cudaSuccess) return cuda_error("cudaStreamEndCapture", ended);
    cudaError_t e = cudaGraphInstantiate(&execs_[k], g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
      execs_[k] = nullptr;
      return cuda_error("cudaGraphInstantiate", e);
    }
    return Status();
  }

  int device_;
  bool graphs_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ev_ = nullptr;
  Batch* table_host_ = nullptr;  // pinned: the graph's copy reads it when it runs
  Batch* table_dev_ = nullptr;
  cudaGraphExec_t execs_[kMaxBatch + 1] = {};  // by batch size
};

class PersistentImpl final : public Persistent {
 public:
  PersistentImpl(int device, uint32_t cap) : device_(device), cap_(cap) {}
  ~PersistentImpl() override {
    (void)stop(std::chrono::seconds(5));
    if (host_) cudaFreeHost(host_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  Status init() {
    DMX_RETURN_IF_ERROR(upload_weights(device_));
    size_t bytes = sizeof(Rings) + 2 * cap_ * sizeof(uint32_t) + cap_ * sizeof(Item);
    if (cudaError_t e = cudaHostAlloc(&host_, bytes, cudaHostAllocMapped); e != cudaSuccess)
      return cuda_error("cudaHostAlloc(doorbells)", e);
    std::memset(host_, 0, bytes);
    rings_ = static_cast<Rings*>(host_);
    entries_ = reinterpret_cast<uint32_t*>(rings_ + 1);
    done_entries_ = entries_ + cap_;
    items_ = reinterpret_cast<Item*>(done_entries_ + cap_);
    void* dev = nullptr;
    if (cudaError_t e = cudaHostGetDevicePointer(&dev, host_, 0); e != cudaSuccess)
      return cuda_error("cudaHostGetDevicePointer", e);
    auto* d_rings = static_cast<Rings*>(dev);
    auto* d_entries = reinterpret_cast<uint32_t*>(d_rings + 1);
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess)
      return cuda_error("cudaStreamCreate", e);
    persistent_kernel<<<1, kThreads, 0, stream_>>>(d_rings, d_entries, d_entries + cap_,
                                                   reinterpret_cast<Item*>(d_entries + 2 * cap_), cap_);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cuda_error("persistent kernel launch", e);
    running_ = true;
    return Status();
  }
  Item* items() override { return items_; }
  void ring(uint32_t slot) override {
    entries_[head_ % cap_] = slot;
    std::atomic_thread_fence(std::memory_order_release);
    rings_->head = ++head_;
  }
  uint32_t poll_done(uint32_t* out, uint32_t max) override {
    uint32_t head = rings_->done_head, n = 0;
    std::atomic_thread_fence(std::memory_order_acquire);
    while (done_tail_ != head && n < max) out[n++] = done_entries_[done_tail_++ % cap_];
    return n;
  }
  Status stop(Duration timeout) override {
    if (!running_) return Status();
    rings_->stop = 1;
    cudaSetDevice(device_);
    cudaEvent_t ev = nullptr;
    if (cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); e != cudaSuccess)
      return cuda_error("cudaEventCreate", e);
    cudaEventRecord(ev, stream_);
    Status s = wait_event(ev, timeout);
    cudaEventDestroy(ev);
    if (s.ok()) running_ = false;
    return s;
  }

 private:
  int device_;
  uint32_t cap_;
  void* host_ = nullptr;
  Rings* rings_ = nullptr;
  uint32_t* entries_ = nullptr;
  uint32_t* done_entries_ = nullptr;
  Item* items_ = nullptr;
  cudaStream_t stream_ = nullptr;
  uint32_t head_ = 0, done_tail_ = 0;
  bool running_ = false;
};

}  // namespace

Result<std::unique_ptr<Launcher>> Launcher::create(int device, bool graphs) {
  auto l = std::make_unique<LauncherImpl>(device, graphs);
  DMX_RETURN_IF_ERROR(l->init());
  return std::unique_ptr<Launcher>(std::move(l));
}

Result<std::unique_ptr<Persistent>> Persistent::create(int device, uint32_t slots) {
  auto p = std::make_unique<PersistentImpl>(device, slots);
  DMX_RETURN_IF_ERROR(p->init());
  return std::unique_ptr<Persistent>(std::move(p));
}

}  // namespace dmx::rpc::device
