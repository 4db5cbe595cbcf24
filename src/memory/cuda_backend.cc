// CUDA device memory (MemKind::kCuda) and pinned host memory (MemKind::kPinned).
//
// Copies run on the copy engines: cudaMemcpyAsync on a non-blocking stream per CopyQueue (no
// thread: the caller's thread issues and polls); push() alone, asked for small copies, uses a
// kernel (GPU push, memory/cuda/push.h). Fences are CUDA events
// from a per-device pool (cuda/event_pool.h), recorded after the copies they cover; a queue keeps
// a few idle ones of its own, so a fence per copy (cuda_ipc) takes no lock and creates no event;
// done() queries the event, wait() polls it against the deadline and never blocks inside CUDA, so
// a stuck device cannot hang the caller past its deadline. Allocation and free are set-up
// operations (cudaFree synchronises the device); the engine keeps buffers for the life of a
// connection.
//
// Without a driver or device every entry point answers Code::kUnavailable with the reason from
// cuda::device_count(); nothing here is called before that check, so a CUDA build runs anywhere.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/log.h"
#include "core/crc32c.h"
#include "memory/backend.h"
#include "memory/cumem.h"
#include "memory/cuda/crc32c.h"
#include "memory/cuda/driver.h"
#include "memory/cuda/event_pool.h"
#include "memory/cuda/list_copy.h"
#include "memory/cuda/push.h"
#include "memory/cuda/runtime.h"

namespace dmx {
namespace {

using cuda::DeviceGuard;
using cuda::error_status;

// Events made up front per device, so that the first fences of the first queues do not create any.
constexpr size_t kEventsReserved = 64;
// Events a queue keeps for its next fences (taken at creation; completed ones return there first).
constexpr size_t kSpareEvents = 8;
// How long a queue being destroyed waits for copies still in flight (their buffers are usually
// freed right after).
constexpr auto kDrainOnDestroy = std::chrono::seconds(10);

// Thread-safety: one thread at a time (CopyQueue's contract); the pool it borrows from is shared.
class CudaQueue final : public CopyQueue {
 public:
  CudaQueue(int device, void* context, cudaStream_t stream, cuda::EventPool* pool, Status kernels)
      : device_(device), context_(context), stream_(stream), pool_(pool), kernels_(std::move(kernels)) {
    // Its first fences then take no pool lock and create no event (best effort: else on demand).
    while (spare_.size() < kSpareEvents) {
      auto ev = pool_->acquire();
      if (!ev.ok()) break;
      spare_.push_back(*ev);
    }
  }

  ~CudaQueue() override {
    if (recorded_ > completed_ && error_.ok()) {
      Status s = wait(recorded_, Deadline::after(kDrainOnDestroy));
      if (!s.ok()) {
        DMX_LOG_WARN("cuda:{} copy queue destroyed with copies in flight: {}", device_, s.to_string());
        (void)lists_.release();  // its buffers may still be in use: leaked
      }
    }
    if (!error_.ok()) (void)lists_.release();  // a failed device: its buffers may be in use, leaked
    lists_.reset();  // before the stream it frees on goes
    for (auto& [fence, ev] : pending_) pool_->release(ev);
    for (cudaEvent_t ev : spare_) pool_->release(ev);
    if (scratch_ != nullptr) {
      DeviceGuard guard(device_);
      (void)cudaFree(scratch_);
    }
    if (results_ != nullptr) (void)cudaFreeHost(results_);
    // cudaStreamDestroy returns at once; work still queued completes first. During process exit the
    // runtime may already be unloading; the error is ignored then.
    (void)cudaStreamDestroy(stream_);
  }

  Status to_host(void* host_dst, const void* dev_src, size_t n) override {
    return copy(host_dst, dev_src, n, cudaMemcpyDeviceToHost, "to_host");
  }
  Status to_device(void* dev_dst, const void* host_src, size_t n) override {
    return copy(dev_dst, host_src, n, cudaMemcpyHostToDevice, "to_device");
  }
  Status copy(void* dst, const void* src, size_t n) override { return copy(dst, src, n, cudaMemcpyDefault, "copy"); }

  Status push(void* dst, const void* src, size_t n) override {
    if (!error_.ok()) return error_;
    if (n == 0) return Status();
    if (!kernels_.ok()) return Status(Code::kUnavailable, "push: " + kernels_.message());
    if (n > cuda::kPushCopyMax)
      return Status(Code::kUnavailable, fmt::format("push: {} B is above the SM copy's {} B", n, cuda::kPushCopyMax));
    DeviceGuard guard(device_);  // kernels launch on the current device; attributes are asked for it
    DMX_RETURN_IF_ERROR(guard.status());
    DMX_RETURN_IF_ERROR(reachable(dst, "destination"));
    DMX_RETURN_IF_ERROR(reachable(src, "source"));
    Status s = cuda::launch_push_copy(dst, src, n, stream_);
    if (s.ok() || check_device().ok()) return s;
    return fail(std::move(s));
  }

  Status copy_list(const Span* spans, size_t n, bool to_host) override {
    if (!error_.ok()) return error_;
    if (!kernels_.ok()) return Status(Code::kUnavailable, "copy_list: " + kernels_.message());
    DeviceGuard guard(device_);  // the kernel launches on the current device
    DMX_RETURN_IF_ERROR(guard.status());
    if (lists_ == nullptr) lists_ = std::make_unique<cuda::ListCopier>(device_, stream_);
    Status s = lists_->enqueue(spans, n, to_host, recorded_ + 1, completed_);
    if (s.ok() || s.code() == Code::kUnavailable || check_device().ok()) return s;
    return fail(std::move(s));
  }

  // Two calls per checksum, since the stream thread that makes them is the staged path's
  // bottleneck: the kernel XORs the raw CRC into one device word that is never reset, and a
  // 4-byte copy brings the word to a pinned slot per ticket; the CRC is the XOR of two
  // consecutive slots. The stream orders the kernels and copies.
  Result<uint64_t> checksum(const void* dev, size_t n) override {
    DMX_RETURN_IF_ERROR(error_);
    DeviceGuard guard(device_);  // kernels launch on the current device
    DMX_RETURN_IF_ERROR(guard.status());
    if (scratch_ == nullptr) {
      DMX_CUDA_RETURN_IF_ERROR("cudaMalloc(crc scratch)", device_, cudaMalloc(reinterpret_cast<void**>(&scratch_), sizeof(uint32_t)));
      // On this stream: a plain cudaMemset runs on the legacy stream, which a non-blocking stream
      // does not wait for (the first kernel could XOR into the word before it is zeroed).
      DMX_CUDA_RETURN_IF_ERROR("cudaMemsetAsync(crc scratch)", device_, cudaMemsetAsync(scratch_, 0, sizeof(uint32_t), stream_));
      DMX_CUDA_RETURN_IF_ERROR("cudaHostAlloc(crc results)", device_,
                               cudaHostAlloc(reinterpret_cast<void**>(&results_), kChecksumsKept * sizeof(uint32_t), cudaHostAllocPortable));
      results_[0] = 0;  // the word before the first ticket
    }
    uint64_t ticket = tickets_ + 1;
    Status s = cuda::launch_crc32c(dev, n, scratch_, stream_);
    if (!s.ok()) return fail(std::move(s));
    // Sticky on any error: the word already holds this CRC, so the chain of slots would be off.
    if (Status c = copy(&results_[ticket % kChecksumsKept], scratch_, sizeof(uint32_t), cudaMemcpyDeviceToHost, "crc");
        !c.ok())
      return fail(std::move(c));
    tickets_ = ticket;
    lengths_[ticket % kChecksumsKept] = n;
    return ticket;
  }
  uint32_t checksum_result(uint64_t ticket) const override {
    size_t i = ticket % kChecksumsKept;
    return crc32c::from_raw(results_[i] ^ results_[(ticket - 1) % kChecksumsKept], lengths_[i]);
  }

  Result<uint64_t> record() override {
    if (!error_.ok()) return error_;
    cudaEvent_t ev = nullptr;
    if (!spare_.empty()) {
      ev = spare_.back();
      spare_.pop_back();
    } else {
      DMX_ASSIGN_OR_RETURN(ev, pool_->acquire());
    }
    cudaError_t err = cudaEventRecord(ev, stream_);
    if (err != cudaSuccess) {
      pool_->release(ev);
      return fail(error_status("cudaEventRecord(copy fence)", device_, err));
    }
    pending_.emplace_back(++recorded_, ev);
    return recorded_;
  }

  Result<bool> done(uint64_t fence) override {
    if (fence <= completed_) return true;
    if (!error_.ok()) return error_;
    if (fence > recorded_)
      return Status(Code::kInvalidArgument,
                    fmt::format("cuda:{} copy fence {} was never recorded (last is {})", device_, fence, recorded_));
    // pending_ holds fences completed_+1 .. recorded_ in order. Copies on one stream finish in
    // order, so when `fence` has completed every earlier one has too: one query suffices.
    size_t index = static_cast<size_t>(fence - completed_ - 1);
    cudaError_t err = cudaEventQuery(pending_[index].second);
    if (err == cudaErrorNotReady) return false;
    if (err != cudaSuccess) return fail(error_status(fmt::format("cudaEventQuery(copy fence {})", fence), device_, err));
    for (size_t i = 0; i <= index; ++i) {
      cudaEvent_t ev = pending_.front().second;
      if (spare_.size() < kSpareEvents) spare_.push_back(ev);
      else pool_->release(ev);
      pending_.pop_front();
    }
    completed_ = fence;
    return true;
  }

  Status wait(uint64_t fence, Deadline deadline) override {
    // Poll, then sleep with growing naps capped by the deadline: never blocks inside CUDA (a
    // blocking cudaEventSynchronize could outlive the deadline on a wedged device). The first
    // polls only yield, because small copies finish in microseconds.
    auto nap = std::chrono::microseconds(5);
    for (int polls = 0;; ++polls) {
      DMX_ASSIGN_OR_RETURN(bool finished, done(fence));
      if (finished) return Status();
      if (deadline.expired())
        return Status(Code::kTimeout, fmt::format("cuda:{} copy fence {} not reached by the deadline (fence {} is the last "
                                                  "completed)",
                                                  device_, fence, completed_));
      if (polls < 64) {
        std::this_thread::yield();
        continue;
      }
      auto sleep = std::chrono::duration_cast<std::chrono::nanoseconds>(nap);
      if (!deadline.is_never()) sleep = std::min(sleep, std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time() - Clock::now()));
      if (sleep.count() > 0) std::this_thread::sleep_for(sleep);
      nap = std::min(nap * 2, std::chrono::microseconds(500));
    }
  }

  Status device_error() override {
    if (!error_.ok()) return error_;
    Status s = check_device();
    return s.ok() ? s : fail(std::move(s));
  }

 private:
  Status copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, const char* what) {
    if (!error_.ok()) return error_;
    if (n == 0) return Status();
    // The stream's device's context must be current: the driver checks the addresses against the
    // current context, and a cuMem mapping is reachable only from the devices it grants access to
    // (driver.h, ContextGuard). A context switch, not cudaSetDevice: no context appears on a
    // device this thread never used, and a thread with none is left with none.
    cuda::driver::ContextGuard ctx(context_);
    DMX_RETURN_IF_ERROR(ctx.status());
    cudaError_t err = cudaMemcpyAsync(dst, src, n, kind, stream_);
    if (err == cudaSuccess) return Status();
    Status s = error_status(fmt::format("cudaMemcpyAsync({}, {} -> {}, {} B)", what, src, dst, n), device_, err);
    // Bad arguments leave the stream usable; otherwise the queue fails only when the device is
    // broken for good (a sticky error), not for an error that was this copy's alone.
    if (s.code() == Code::kInvalidArgument || check_device().ok()) return s;
    return fail(std::move(s));
  }

  // Whether this queue's SMs may load or store at `p` (the current device is ours): our memory, a
  // peer GPU's with peer access on (enabled here once per peer, as cuda_ipc's engines do), or
  // pinned host memory mapped at the same address; on a peer, only cudaMalloc memory (a cuMem
  // mapping's access is per device). Anything else would fault the kernel, and a
  // kernel fault is sticky for the whole process, so "unsure" is "no".
  Status reachable(const void* p, const char* what) {
    cudaPointerAttributes a{};
    cudaError_t err = cudaPointerGetAttributes(&a, p);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return Status(Code::kUnavailable, fmt::format("push: the {} {} is not CUDA-known memory", what, p));
    }
    if (a.type == cudaMemoryTypeHost && a.devicePointer == p) return Status();
    if (a.type == cudaMemoryTypeDevice) {
      if (a.device == device_) return Status();
      if (a.device >= 0 && a.device < static_cast<int>(peer_ok_.size())) {
        int8_t& ok = peer_ok_[a.device];
        if (ok == 0) {
          int can = 0;
          ok = -1;
          if (cudaDeviceCanAccessPeer(&can, device_, a.device) == cudaSuccess && can) {
            cudaError_t e = cudaDeviceEnablePeerAccess(a.device, 0);
            if (e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled) ok = 1;
          }
          (void)cudaGetLastError();
        }
        // Peer access covers cudaMalloc memory; a cuMem mapping grants access per device
        // (cuMemSetAccess), which peer access does not change: those are left to the copy engine.
        auto legacy = cuda::driver::legacy_ipc_capable(p);
        if (ok == 1 && legacy.ok() && *legacy) return Status();
        if (ok == 1)
          return Status(Code::kUnavailable,
                        fmt::format("push: the {} on cuda:{} is not cudaMalloc memory (a cuMem mapping, whose "
                                    "access peer access does not grant, or the driver cannot tell)",
                                    what, a.device));
      }
      return Status(Code::kUnavailable,
                    fmt::format("push: cuda:{} has no peer access to cuda:{} (the {})", device_, a.device, what));
    }
    return Status(Code::kUnavailable, fmt::format("push: the {} {} is not device or mapped pinned memory", what, p));
  }

  // Ok unless the device has a sticky error (one that fails every later call of this process on
  // it); clears the non-sticky error a failed call left behind.
  Status check_device() {
    DeviceGuard guard(device_);
    DMX_RETURN_IF_ERROR(guard.status());
    (void)cudaGetLastError();
    cudaError_t err = cudaStreamQuery(stream_);
    if (err == cudaSuccess || err == cudaErrorNotReady) return Status();
    return error_status("cudaStreamQuery(copy queue device check)", device_, err);
  }

  Status fail(Status s) {
    DMX_LOG_ERROR("{}", s.message());
    if (error_.ok()) error_ = s;
    return s;
  }

  const int device_;
  void* const context_;  // device_'s primary context (CUcontext)
  const cudaStream_t stream_;
  cuda::EventPool* const pool_;
  const Status kernels_;  // ok when the push and segment kernels are loaded (CudaBackend::init)
  std::deque<std::pair<uint64_t, cudaEvent_t>> pending_;  // recorded, not yet seen complete
  std::vector<cudaEvent_t> spare_;                        // idle, for the next fences
  uint64_t recorded_ = 0;
  uint64_t completed_ = 0;
  uint32_t* scratch_ = nullptr;  // device: the XOR of every raw CRC so far; made at the first checksum
  uint32_t* results_ = nullptr;  // pinned: scratch after ticket t in slot t % kChecksumsKept
  std::array<uint64_t, kChecksumsKept> lengths_{};
  uint64_t tickets_ = 0;
  std::array<int8_t, 64> peer_ok_{};  // per device: 0 unknown, 1 the SMs reach it, -1 not
  std::unique_ptr<cuda::ListCopier> lists_;  // made at the first copy_list
  Status error_;  // sticky: after a device error every call fails with it
};

Result<void*> host_alloc(size_t size, int device_for_errors) {
  void* p = nullptr;
  // Portable: pinned for every CUDA context, so staging works with any device.
  cudaError_t err = cudaHostAlloc(&p, std::max<size_t>(size, 1), cudaHostAllocPortable);
  if (err != cudaSuccess)
    return error_status(fmt::format("cudaHostAlloc({} B, portable)", size), device_for_errors, err);
  return p;
}

void host_free(void* ptr, int device_for_errors) {
  if (ptr == nullptr) return;
  cudaError_t err = cudaFreeHost(ptr);
  if (err != cudaSuccess && err != cudaErrorCudartUnloading)
    DMX_LOG_ERROR("{}", error_status(fmt::format("cudaFreeHost({})", ptr), device_for_errors, err).message());
}

class CudaBackend final : public MemoryBackend {
 public:
  explicit CudaBackend(int device) : device_(device), events_(device) {}
  Status init() {
    DMX_ASSIGN_OR_RETURN(context_, cuda::driver::primary_context(device_));
    DMX_RETURN_IF_ERROR(events_.reserve(kEventsReserved));
    // dmx's kernels are loaded now, not at their first launch: under lazy loading that launch may
    // wait for the device to go idle, which a user's kernel spinning until a transfer lands never
    // does (push.h). A push kernel that cannot load leaves push unavailable (the copy engines copy);
    // a CRC kernel that cannot load fails at its launch, as before.
    DeviceGuard guard(device_);
    DMX_RETURN_IF_ERROR(guard.status());
    kernels_ = cuda::preload_push_copy();
    if (kernels_.ok()) kernels_ = cuda::preload_segment_copy();
    if (!kernels_.ok()) DMX_LOG_INFO("cuda:{}: {}; no GPU push, no list copies", device_, kernels_.message());
    if (Status crc = cuda::preload_crc32c(); !crc.ok()) DMX_LOG_INFO("cuda:{}: {}", device_, crc.message());
    return Status();
  }

  MemSpec spec() const override { return MemSpec{MemKind::kCuda, device_}; }
  bool host_accessible() const override { return false; }

  Result<void*> allocate(size_t size) override {
    DeviceGuard guard(device_);
    DMX_RETURN_IF_ERROR(guard.status());
    void* p = nullptr;
    DMX_CUDA_RETURN_IF_ERROR(fmt::format("cudaMalloc({} B)", size), device_, cudaMalloc(&p, std::max<size_t>(size, 1)));
    return p;
  }

  void free(void* ptr, size_t size) override {
    if (ptr == nullptr) return;
    DeviceGuard guard(device_);
    cudaError_t err = cudaFree(ptr);
    if (err != cudaSuccess && err != cudaErrorCudartUnloading)
      DMX_LOG_ERROR("{}", error_status(fmt::format("cudaFree({}, {} B)", ptr, size), device_, err).message());
  }

  Result<std::unique_ptr<CopyQueue>> create_queue() override {
    DeviceGuard guard(device_);
    DMX_RETURN_IF_ERROR(guard.status());
    cudaStream_t stream = nullptr;
    DMX_CUDA_RETURN_IF_ERROR("cudaStreamCreateWithFlags(cudaStreamNonBlocking)", device_,
                             cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    return std::unique_ptr<CopyQueue>(std::make_unique<CudaQueue>(device_, context_, stream, &events_, kernels_));
  }

  Result<void*> allocate_staging(size_t size) override { return host_alloc(size, device_); }
  void free_staging(void* ptr, size_t) override { host_free(ptr, device_); }

 private:
  const int device_;
  void* context_ = nullptr;  // the primary context, made current around copies
  cuda::EventPool events_;
  Status kernels_;  // set by init(): whether the push and segment kernels are loaded on device_
};

class PinnedBackend final : public MemoryBackend {
 public:
  MemSpec spec() const override { return MemSpec{MemKind::kPinned, 0}; }
  bool host_accessible() const override { return true; }
  Result<void*> allocate(size_t size) override { return host_alloc(size, -1); }
  void free(void* ptr, size_t) override { host_free(ptr, -1); }
  Result<void*> allocate_staging(size_t size) override { return host_alloc(size, -1); }
  void free_staging(void* ptr, size_t) override { host_free(ptr, -1); }
};

}  // namespace

Result<int> cuda_device_count() { return cuda::device_count(); }

Result<void*> cuda_cumem_alloc(int device, size_t size, size_t block) {
  return cuda::driver::alloc_cumem_range(device, size, block);
}
Result<void*> cuda_cumem_alloc_owner_only(int device, size_t size) {
  DMX_RETURN_IF_ERROR(cuda::check_device(device));
  return cuda::driver::alloc_cumem_range(device, size, size, /*owner_only=*/true);
}
void cuda_cumem_free(void* ptr) {
  cuda::driver::free_cumem_range(ptr);
}
Status cuda_cumem_ipc_supported(int device) {
  return cuda::driver::cumem_ipc_supported(device);
}

Result<MemoryBackend*> cuda_backend(int device) {
  DMX_RETURN_IF_ERROR(cuda::check_device(device));
  // Leaked on purpose: backends live until the process exits, and their events and streams must
  // not be destroyed by static destructors after the CUDA runtime has shut down.
  static std::mutex mu;
  static auto* backends = new std::map<int, CudaBackend*>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = backends->find(device);
  if (it != backends->end()) return static_cast<MemoryBackend*>(it->second);
  auto backend = std::make_unique<CudaBackend>(device);
  DMX_RETURN_IF_ERROR(backend->init());
  MemoryBackend* b = backend.get();
  (*backends)[device] = backend.release();
  return b;
}

Result<MemoryBackend*> pinned_backend() {
  // Pinning goes through the driver, so pinned memory needs a usable device like kCuda does.
  DMX_RETURN_IF_ERROR(cuda::device_count().status());
  static auto* backend = new PinnedBackend();
  return static_cast<MemoryBackend*>(backend);
}

}  // namespace dmx
