// The openers of the cuda_ipc copy engine: legacy IPC handles mapped once per process (Mappings),
// cuMem allocations mapped from their fds per opener, and this process's own exports for peers
// in this process.
#include "transport/cuda_ipc/openers.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cassert>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "core/log.h"
#include "memory/cuda/runtime.h"

namespace dmx::cuda_ipc::detail {
namespace {

using cuda::DeviceGuard;
using cuda::error_status;

static_assert(sizeof(cudaIpcMemHandle_t) == IpcDescriptor::kHandleSize);

// One mapping per IPC handle per process. CUDA refuses to open a handle that this process has
// open already (UCX saw "Element already exists", openucx/ucx#3192, #4599), which two copy
// engines of one path (two local GPUs) or two paths to one peer process would otherwise do.
// So every opener shares this table: the first open maps (under its device), later ones count a
// reference and get the same base, and the last close unmaps (under the device that mapped).
class Mappings {
 public:
  static Mappings& get() {
    static Mappings* m = new Mappings;  // never destroyed: closes may run during static destruction
    return *m;
  }
  Result<void*> open(const IpcDescriptor& desc, int device) {
    std::lock_guard lock(mu_);
    auto it = by_handle_.find(desc.handle);
    if (it != by_handle_.end()) {
      if (it->second.size != 0 && it->second.size < desc.alloc_size)
        return Status(Code::kProtocol, fmt::format("cuda_ipc: pid {} described allocation {} as {} B, but its handle "
                                                   "maps {} B", desc.owner_pid, desc.alloc_id, desc.alloc_size,
                                                   it->second.size));
      ++it->second.refs;
      return it->second.base;
    }
    DeviceGuard guard(device);
    DMX_RETURN_IF_ERROR(guard.status());
    cudaIpcMemHandle_t h;
    std::memcpy(&h, desc.handle.data(), sizeof h);
    void* base = nullptr;
    cudaError_t err = cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      Status s = error_status(fmt::format("cudaIpcOpenMemHandle(alloc {} of pid {}, {} B)", desc.alloc_id,
                                          desc.owner_pid, desc.alloc_size),
                              device, err);
      if (desc.owner_pid == ::getpid())
        s = Status(s.code(), s.message() + " (the descriptor names this process: CUDA IPC cannot open a handle in the "
                                           "process that made it)");
      return s;
    }
    // The descriptor is the peer's word: check its allocation size against what was mapped, or a
    // lie would make our copies fault (a sticky error that breaks every copy of this process).
    // Only a size the driver does report is held against it.
    auto range = cuda::driver::allocation_range(base);
    if (range.ok() && range->size < desc.alloc_size) {
      (void)cudaIpcCloseMemHandle(base);
      return Status(Code::kProtocol, fmt::format("cuda_ipc: pid {} described allocation {} as {} B, but its handle maps "
                                                 "{} B", desc.owner_pid, desc.alloc_id, desc.alloc_size, range->size));
    }
    by_handle_.emplace(desc.handle, Mapping{base, device, 1, range.ok() ? range->size : 0});
    by_base_.emplace(base, desc.handle);
    return base;
  }
  void close(void* base) {
    std::lock_guard lock(mu_);
    auto b = by_base_.find(base);
    if (b == by_base_.end()) {
      assert(false && "closing an IPC mapping that is not open");
      return;
    }
    auto it = by_handle_.find(b->second);
    if (--it->second.refs > 0) return;
    int device = it->second.device;
    by_handle_.erase(it);
    by_base_.erase(b);
    DeviceGuard guard(device);
    cudaError_t err = cudaIpcCloseMemHandle(base);
    if (err != cudaSuccess)
      DMX_LOG_WARN("cudaIpcCloseMemHandle({}) on cuda:{}: {}", base, device, cuda::error_text(err));
  }

 private:
  struct Mapping {
    void* base;
    int device;  // whose context mapped it
    uint32_t refs;
    size_t size;  // as the driver reports it; 0: unknown
  };
  std::mutex mu_;  // guards both maps
  std::map<std::array<uint8_t, IpcDescriptor::kHandleSize>, Mapping> by_handle_;
  std::map<void*, std::array<uint8_t, IpcDescriptor::kHandleSize>> by_base_;
};

// This process's exports, for peers in this process (Options::in_process): allocation id -> the
// exporter's pointer. Ids come from one process-wide counter, so they are unique here.
std::atomic<uint64_t> g_next_alloc_id{1};

class InProcessExports {
 public:
  static InProcessExports& get() {
    static InProcessExports* t = new InProcessExports;  // never destroyed, like Mappings
    return *t;
  }
  void add(uint64_t id, uintptr_t base, uint64_t size, uint64_t buffer_id) {
    std::lock_guard lock(mu_);
    by_id_[id] = Entry{base, size, buffer_id};
  }
  void remove(uint64_t id) {
    std::lock_guard lock(mu_);
    by_id_.erase(id);
  }
  Result<void*> resolve(const IpcDescriptor& d) {
    Entry e;
    {
      std::lock_guard lock(mu_);
      auto it = by_id_.find(d.alloc_id);
      if (it == by_id_.end())
        return Status(Code::kNotFound, fmt::format("cuda_ipc in one process: allocation {} is not exported here (freed "
                                                   "meanwhile?)",
                                                   d.alloc_id));
      e = it->second;
    }
    if (e.size != d.alloc_size)
      return Status(Code::kProtocol, fmt::format("cuda_ipc in one process: allocation {} described as {} B, exported "
                                                 "as {} B",
                                                 d.alloc_id, d.alloc_size, e.size));
    // Still the allocation that was exported, not memory freed and allocated again at its address.
    auto id = cuda::driver::buffer_id(reinterpret_cast<void*>(e.base));
    if (!id.ok() || *id != e.buffer_id)
      return Status(Code::kNotFound, fmt::format("cuda_ipc in one process: allocation {} was freed", d.alloc_id));
    return reinterpret_cast<void*>(e.base);
  }

 private:
  struct Entry {
    uintptr_t base = 0;
    uint64_t size = 0, buffer_id = 0;
  };
  std::mutex mu_;
  std::unordered_map<uint64_t, Entry> by_id_;
};

}  // namespace

Result<void*> open_ipc_mapping(const IpcDescriptor& desc, int device) { return Mappings::get().open(desc, device); }
void close_ipc_mapping(void* base) { Mappings::get().close(base); }
uint64_t next_alloc_id() { return g_next_alloc_id.fetch_add(1, std::memory_order_relaxed); }
void add_in_process_export(uint64_t id, uintptr_t base, uint64_t size, uint64_t buffer_id) {
  InProcessExports::get().add(id, base, size, buffer_id);
}
void remove_in_process_export(uint64_t id) { InProcessExports::get().remove(id); }

Result<void*> InProcessOpener::open(const IpcDescriptor& desc) {
  if (desc.owner_pid != ::getpid())
    return Status(Code::kProtocol, fmt::format("cuda_ipc in one process: the descriptor names pid {}, not this "
                                               "process ({})",
                                               desc.owner_pid, ::getpid()));
  return InProcessExports::get().resolve(desc);
}

CudaOpener::~CudaOpener() {
  for (auto& [base, m] : cumem_) cuda::driver::unmap_cumem(m);
}

Result<void*> CudaOpener::open(const IpcDescriptor& desc) {
  if (desc.kind == IpcDescriptor::Kind::kIpcHandle) return Mappings::get().open(desc, device_);
  if (fds_ == nullptr)
    return Status(Code::kUnavailable, fmt::format("cuda_ipc: pid {} described a cuMem allocation, and no side "
                                                  "channel brings its fd",
                                                  desc.owner_pid));
  DMX_ASSIGN_OR_RETURN(int fd, fds_->fd_for(desc.alloc_id));
  DeviceGuard guard(device_);
  DMX_RETURN_IF_ERROR(guard.status());
  auto m = cuda::driver::import_cumem_fd(fd, desc.alloc_size, device_);
  if (!m.ok())
    return Status(m.status().code(),
                  fmt::format("cuda_ipc: mapping cuMem allocation {} of pid {} ({} B): {}", desc.alloc_id,
                              desc.owner_pid, desc.alloc_size, m.status().message()));
  cumem_.emplace(reinterpret_cast<void*>(m->base), *m);
  return reinterpret_cast<void*>(m->base);
}

void CudaOpener::close(void* base) {
  auto it = cumem_.find(base);
  if (it == cumem_.end()) {
    Mappings::get().close(base);
    return;
  }
  cuda::driver::unmap_cumem(it->second);
  cumem_.erase(it);
}

}  // namespace dmx::cuda_ipc::detail
