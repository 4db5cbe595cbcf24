// The Lynx worker kernel: one persistent thread block per worker polls its request ring in GPU
// memory, computes, writes the response into the pinned host TX ring and releases its flag.
// Memory ordering (docs/mqueue.md): flags are read with system-scope acquire loads; a response
// is published by every thread fencing its stores (__threadfence_system), a barrier, and a
// system-scope release store of the flag by thread 0.
#include <cuda/atomic>
#include <cuda_runtime.h>

#include <chrono>
#include <string>
#include <thread>

#include "mqueue/gpu_workers.h"

namespace dmx::mqueue {
namespace {

struct Args {
  uint8_t* wmem;  // worker memory (device)
  uint8_t* rmem;  // response memory (pinned host, device-mapped)
  Layout l;
  uint32_t app;
};

__device__ uint32_t ld_acquire(uint8_t* base, uint64_t off) {
  cuda::atomic_ref<uint32_t, cuda::thread_scope_system> a(*reinterpret_cast<uint32_t*>(base + off));
  return a.load(cuda::memory_order_acquire);
}
__device__ void st_release(uint8_t* base, uint64_t off, uint32_t v) {
  cuda::atomic_ref<uint32_t, cuda::thread_scope_system> a(*reinterpret_cast<uint32_t*>(base + off));
  a.store(v, cuda::memory_order_release);
}

// Spins until ready(); false once the host sets the stop word (read over PCIe, so rarely).
template <typename Ready>
__device__ bool spin(const Args& a, Ready ready) {
  for (uint32_t i = 1;; ++i) {
    if (ready()) return true;
    if ((i & 1023) == 0 && ld_acquire(a.rmem, a.l.stop) != 0) return false;
    if (i > 4096) __nanosleep(256);
  }
}

// XOR in 8-byte words (payloads start 8 bytes into 64-byte slots), the tail in bytes.
__device__ void xor_block(const uint8_t* in, uint8_t* out, uint32_t n) {
  const uint32_t words = n / 8;
  const uint64_t key = 0x0101010101010101ull * kXorKey;
  auto* i8 = reinterpret_cast<const uint64_t*>(in);
  auto* o8 = reinterpret_cast<uint64_t*>(out);
  for (uint32_t i = threadIdx.x; i < words; i += blockDim.x) o8[i] = i8[i] ^ key;
  for (uint32_t i = words * 8 + threadIdx.x; i < n; i += blockDim.x) out[i] = in[i] ^ kXorKey;
}

__global__ void lynx_workers(Args a) {
  const Layout& l = a.l;
  const uint32_t w = blockIdx.x, n = l.g.slots;
  __shared__ uint32_t s_go, s_len, s_status, s_ref_len, s_call_slot;
  __shared__ unsigned long long s_dist;
  uint32_t call_seq = 0;  // thread 0's
  for (uint32_t seq = 0;; ++seq) {
    const uint32_t s = seq & (n - 1);
    if (threadIdx.x == 0) {
      bool go = spin(a, [&] { return ld_acquire(a.wmem, l.rx_flag(w, s)) == seq + 1; }) &&
                spin(a, [&] { return seq - ld_acquire(a.wmem, l.ctl_of(w) + offsetof(WorkerCtl, tx_credit)) < n; });
      s_go = go;
      if (go) {
        const SlotHeader* h = reinterpret_cast<const SlotHeader*>(a.wmem + l.rx_slot(w, s));
        s_len = min(h->len, l.g.max_request);
      }
      s_status = kSlotOk;
      s_dist = 0;
    }
    __syncthreads();
    if (!s_go) return;
    const uint8_t* req = a.wmem + l.rx_slot(w, s) + sizeof(SlotHeader);
    uint8_t* out = a.rmem + l.tx_slot(w, s);
    uint32_t out_len = 0;
    if (a.app == static_cast<uint32_t>(AppKind::kXor)) {
      out_len = min(s_len, l.g.max_response);
      if (s_len > l.g.max_response) s_status = kSlotAppError;
      xor_block(req, out + sizeof(SlotHeader), out_len);
    } else {
      // Face verification: fetch the reference image of the request's id through the client queue.
      const bool ok = s_len >= 4 && l.g.call_slots > 0 && l.g.max_response >= 8;
      if (threadIdx.x == 0) {
        s_ref_len = 0;
        if (!ok) {
          s_status = kSlotAppError;
        } else {
          const uint32_t cs = call_seq & (l.g.call_slots - 1);
          s_call_slot = cs;  // call_seq lives in thread 0 only; the block reads the reply's slot here
          bool go = spin(a, [&] {
            return call_seq - ld_acquire(a.wmem, l.ctl_of(w) + offsetof(WorkerCtl, call_credit)) < l.g.call_slots;
          });
          uint8_t* cslot = a.rmem + l.ctx_slot(w, cs);
          reinterpret_cast<SlotHeader*>(cslot)->len = 4;
          reinterpret_cast<SlotHeader*>(cslot)->status = 0;
          *reinterpret_cast<uint32_t*>(cslot + sizeof(SlotHeader)) = *reinterpret_cast<const uint32_t*>(req);
          __threadfence_system();
          if (go) st_release(a.rmem, l.ctx_flag(w, cs), call_seq + 1);
          go = go && spin(a, [&] { return ld_acquire(a.wmem, l.crx_flag(w, cs)) == call_seq + 1; });
          const SlotHeader* rh = reinterpret_cast<const SlotHeader*>(a.wmem + l.crx_slot(w, cs));
          if (!go || rh->status != kSlotOk || rh->len > l.g.max_call) {
            s_status = kSlotAppError;
          } else {
            s_ref_len = rh->len;
          }
          ++call_seq;
        }
      }
      __syncthreads();
      if (s_status == kSlotOk) {
        const uint8_t* img = req + 4;
        const uint8_t* ref = a.wmem + l.crx_slot(w, s_call_slot) + sizeof(SlotHeader);
        const uint32_t m = min(s_len - 4, s_ref_len);
        unsigned long long d = 0;
        for (uint32_t i = threadIdx.x; i < m; i += blockDim.x) d += img[i] > ref[i] ? img[i] - ref[i] : ref[i] - img[i];
        atomicAdd(&s_dist, d);
        __syncthreads();
        if (threadIdx.x == 0) {
          const uint64_t img_len = s_len - 4;
          uint32_t r[2] = {img_len == s_ref_len && s_dist <= img_len * kFaceMatchMeanDiff ? 1u : 0u,
                           static_cast<uint32_t>(min(s_dist, 0xffffffffull))};
          reinterpret_cast<uint32_t*>(out + sizeof(SlotHeader))[0] = r[0];
          reinterpret_cast<uint32_t*>(out + sizeof(SlotHeader))[1] = r[1];
        }
      }
      out_len = s_status == kSlotOk ? 8 : 0;
    }
    __threadfence_system();  // this thread's response stores before the flag
    __syncthreads();
    if (threadIdx.x == 0) {
      reinterpret_cast<SlotHeader*>(out)->len = out_len;
      reinterpret_cast<SlotHeader*>(out)->status = s_status;
      __threadfence_system();
      st_release(a.rmem, l.tx_flag(w, s), seq + 1);
    }
  }
}

__global__ void xor_once(const uint8_t* in, uint8_t* out, uint32_t n) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = in[i] ^ kXorKey;
}

Status cuda_error(const std::string& call, cudaError_t err) {
  return Status(Code::kIo, call + " failed: " + cudaGetErrorString(err));
}

// Waits for the stream with a deadline (cudaStreamSynchronize has none).
Status wait_stream(cudaStream_t stream, Duration timeout, const char* what) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (unsigned i = 0;; ++i) {
    cudaError_t err = cudaStreamQuery(stream);
    if (err == cudaSuccess) return Status();
    if (err != cudaErrorNotReady) return cuda_error(what, err);
    if (std::chrono::steady_clock::now() >= deadline)
      return Status(Code::kTimeout, std::string(what) + " did not finish in time");
    if (i > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace

struct GpuWorkers::Impl {
  QueueSet* q = nullptr;
  int device = 0;
  cudaStream_t stream = nullptr;
  bool running = false;
};

struct GpuLauncher::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
};

Status gpu_workers_available(int device) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) return Status(Code::kUnavailable, std::string("mqueue GPU workers: ") + cudaGetErrorString(err));
  if (device < 0 || device >= n)
    return Status(Code::kUnavailable, "mqueue GPU workers: no CUDA device " + std::to_string(device) + " (" +
                                          std::to_string(n) + " present)");
  return Status();
}

Result<std::unique_ptr<GpuWorkers>> GpuWorkers::start(QueueSet* queues, AppKind app, uint32_t threads) {
  MemSpec where = queues->worker_where();
  if (where.kind != MemKind::kCuda)
    return Status(Code::kInvalidArgument, "GPU workers need cuda worker memory, not " + to_string(where));
  DMX_RETURN_IF_ERROR(gpu_workers_available(where.device));
  auto impl = std::make_unique<Impl>();
  impl->q = queues;
  impl->device = where.device;
  int prev = 0;
  (void)cudaGetDevice(&prev);
  cudaError_t err = cudaSetDevice(where.device);
  if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) return cuda_error("cudaStreamCreateWithFlags", err);
  Args a{queues->worker_base(), queues->response_base(), queues->layout(), static_cast<uint32_t>(app)};
  void* dev_rmem = nullptr;  // the same address under unified addressing; asked anyway
  if (cudaHostGetDevicePointer(&dev_rmem, queues->response_base(), 0) == cudaSuccess) a.rmem = static_cast<uint8_t*>(dev_rmem);
  (void)cudaGetLastError();
  lynx_workers<<<queues->layout().g.workers, threads, 0, impl->stream>>>(a);
  err = cudaGetLastError();
  (void)cudaSetDevice(prev);
  if (err != cudaSuccess) {
    (void)cudaStreamDestroy(impl->stream);
    return cuda_error("launching the mqueue worker kernel", err);
  }
  impl->running = true;
  return std::unique_ptr<GpuWorkers>(new GpuWorkers(std::move(impl)));
}

GpuWorkers::GpuWorkers(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuWorkers::~GpuWorkers() { (void)stop(); }

Status GpuWorkers::stop(Duration timeout) {
  if (!impl_ || !impl_->running) return Status();
  impl_->q->store_response_word(impl_->q->layout().stop, 1);
  Status st = wait_stream(impl_->stream, timeout, "the mqueue worker kernel");
  if (st.code() == Code::kTimeout) return st;  // still running: keep the stream and the memory
  impl_->running = false;
  (void)cudaStreamDestroy(impl_->stream);
  return st;
}

namespace {

class StreamWriter : public WorkerWriter {
 public:
  StreamWriter(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  ~StreamWriter() override {
    (void)wait_stream(stream_, std::chrono::seconds(5), "the mqueue copy stream");
    (void)cudaStreamDestroy(stream_);
  }
  Status copy(void* dst, const void* src, size_t n) override {
    cudaError_t err = cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream_);
    if (err == cudaSuccess && (++calls_ & 255) == 0) {  // now and then: an asynchronous failure?
      err = cudaStreamQuery(stream_);
      if (err == cudaErrorNotReady) err = cudaSuccess;
    }
    if (err != cudaSuccess)
      return cuda_error("cudaMemcpyAsync(" + std::to_string(n) + " B into cuda:" + std::to_string(device_) + ")", err);
    return Status();
  }

 private:
  int device_;
  cudaStream_t stream_;
  uint64_t calls_ = 0;
};

}  // namespace

Result<std::unique_ptr<WorkerWriter>> make_stream_writer(int device) {
  DMX_RETURN_IF_ERROR(gpu_workers_available(device));
  int prev = 0;
  (void)cudaGetDevice(&prev);
  cudaStream_t stream = nullptr;
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  (void)cudaSetDevice(prev);
  if (err != cudaSuccess) return cuda_error("cudaStreamCreateWithFlags", err);
  return std::unique_ptr<WorkerWriter>(new StreamWriter(device, stream));
}

Result<std::unique_ptr<GpuLauncher>> GpuLauncher::create(int device) {
  DMX_RETURN_IF_ERROR(gpu_workers_available(device));
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  int prev = 0;
  (void)cudaGetDevice(&prev);
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking);
  (void)cudaSetDevice(prev);
  if (err != cudaSuccess) return cuda_error("cudaStreamCreateWithFlags", err);
  return std::unique_ptr<GpuLauncher>(new GpuLauncher(std::move(impl)));
}

GpuLauncher::GpuLauncher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuLauncher::~GpuLauncher() {
  if (impl_ && impl_->stream) (void)cudaStreamDestroy(impl_->stream);
}

Status GpuLauncher::run_xor(const void* in, void* out, uint32_t len, Duration timeout) {
  if (len == 0) return Status();
  const uint32_t threads = 256, blocks = std::min(64u, (len + threads - 1) / threads);
  cudaError_t set = cudaSetDevice(impl_->device);  // the stream's device (cheap when already current)
  if (set != cudaSuccess) return cuda_error("cudaSetDevice", set);
  xor_once<<<blocks, threads, 0, impl_->stream>>>(static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out), len);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return cuda_error("launching xor_once", err);
  return wait_stream(impl_->stream, timeout, "xor_once");
}

}  // namespace dmx::mqueue
