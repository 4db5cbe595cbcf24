// The one door to the CUDA driver API (internal; CUDA builds only).
//
// dmx links the CUDA runtime statically and never links libcuda: driver-API functions are
// resolved at run time through cudaGetDriverEntryPointByVersion (cudaGetDriverEntryPoint on
// runtimes before 12.5), each at the oldest CUDA version that has the signature dmx uses, so an
// old driver simply lacks a symbol and dmx says so. Only driver.cc includes <cuda.h>; callers
// see dmx types. Call these only after cuda::device_count() succeeded (the runtime must be able
// to load the driver). Thread-safe: symbols are resolved once and cached.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/sys.h"
#include "dmx/status.h"

namespace dmx::cuda::driver {

// What a driver call answered, by the classes dmx reacts to; `text` is
// "cuMemGetHandleForAddressRange(...) failed: CUDA_ERROR_NOT_SUPPORTED (operation not supported)".
struct DriverError {
  enum Kind { kOk, kInvalidValue, kNotSupported, kNotFound, kOutOfMemory, kOther } kind = kOk;
  int code = 0;  // the CUresult, for logs
  std::string text;
  bool ok() const { return kind == kOk; }
  Status to_status(Code code_if_error) const;
};

// The driver's CUDA version (e.g. 13000), or why the driver cannot be asked.
Result<int> driver_version();

// The primary context of `device` (retained once per process and never released: the runtime
// shares it), as an opaque CUcontext.
Result<void*> primary_context(int device);

// Makes context `ctx` current on the calling thread for the guard's life when another context, or
// none, is current, and then puts back exactly what was current before (none included). Unlike a
// DeviceGuard (cudaSetDevice) it never creates a context, so a thread that had none ends with
// none, and a device nobody uses gets no context. One thread-local query when `ctx` is current.
// Why copies need it: the driver checks that a copy's addresses are accessible from the *current*
// context, not from the stream's; a cuMem mapping (NCCL's buffers, PyTorch's expandable segments)
// grants access per device (cuMemSetAccess), so a copy of cuda:1's mapping issued on cuda:1's
// stream by a thread whose current context is cuda:0's (or none: the runtime then makes cuda:0's
// current) fails with CUDA_ERROR_INVALID_VALUE (docs/cuda-notes.md).
class ContextGuard {
 public:
  explicit ContextGuard(void* ctx);
  ~ContextGuard();
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;
  const Status& status() const { return status_; }

 private:
  void* previous_ = nullptr;
  bool restore_ = false;
  Status status_;
};

// An integer device attribute by its CUdevice_attribute name, for the attributes dmx asks about.
enum class DeviceAttribute {
  kDmaBufSupported,
  kGpuDirectRdmaSupported,
  kPciBusId,
  kPciDeviceId,
  kPciDomainId,
  kVirtualMemoryManagementSupported,
  kPosixFdHandleSupported,
  kGpuDirectRdmaWithCudaVmmSupported,
};
Result<int> device_attribute(int device, DeviceAttribute attribute);

// The allocation (base, size) that contains `ptr`, and the device that owns it;
// kInvalidArgument when ptr is not CUDA device memory.
struct AllocationRange {
  uintptr_t base = 0;
  size_t size = 0;
  int device = -1;
};
Result<AllocationRange> allocation_range(const void* ptr);

// CU_POINTER_ATTRIBUTE_BUFFER_ID of the allocation holding `ptr`: an id the driver never reuses
// within a process, so memory freed and allocated again at the same address gets a new one (what
// a cache keyed by address checks before trusting an entry). kInvalidArgument when ptr is not
// CUDA memory.
Result<uint64_t> buffer_id(const void* ptr);

// cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD) over [ptr, ptr+size), both
// page aligned; `pcie_mapping` sets CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE. On success *fd
// is a new dmabuf fd owned by the caller. A missing entry point reads kNotFound.
DriverError get_dmabuf_fd(void* ptr, size_t size, bool pcie_mapping, int* fd);

// Whether this driver knows the PCIe mapping flag at all (CUDA 12.8 and later).
bool knows_pcie_mapping_flag(int driver_version);

// ---- cuMem allocations (cuMemCreate + cuMemMap: PyTorch's expandable segments, NCCL's buffers) ----
// Each such allocation is one physical block mapped at one place; allocation_range() of a pointer
// inside it gives that mapping (one block), even when the next block is mapped right after it.

// Whether cuMem allocations on `device` can be shared as POSIX fds (the driver's entry points and
// the device's VIRTUAL_MEMORY_MANAGEMENT and HANDLE_TYPE_POSIX_FILE_DESCRIPTOR attributes), or why not.
Status cumem_ipc_supported(int device);

// Ok when the allocation holding `ptr` is a cuMem allocation that may be exported as a POSIX fd;
// kUnavailable with the reason when not (made without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
// managed memory, a stream-ordered pool, ...).
Status cumem_fd_exportable(const void* ptr);

// Whether `ptr` lies in memory the legacy IPC API can share (cudaMalloc), as opposed to a cuMem
// (virtual memory) mapping, whose access is granted per device (cuMemSetAccess), not by peer
// access (CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE). kUnavailable when the driver cannot say.
Result<bool> legacy_ipc_capable(const void* ptr);

// A new POSIX fd for the cuMem allocation holding `ptr` (cuMemRetainAllocationHandle, then
// cuMemExportToShareableHandle). The fd keeps the allocation alive while it is open.
Result<UniqueFd> export_cumem_fd(const void* ptr);

// A peer's cuMem allocation mapped here from its fd (cuMemImportFromShareableHandle, a reserved
// range, cuMemMap, read-write access for `device`). `size` must be the allocation's (a multiple
// of the mapping granularity); the driver refuses a size larger than the allocation.
struct CuMemMapping {
  uintptr_t base = 0;
  size_t size = 0;
  unsigned long long handle = 0;  // NOLINT(google-runtime-int): CUmemGenericAllocationHandle
};
Result<CuMemMapping> import_cumem_fd(int fd, size_t size, int device);
// Unmaps and releases it (failures are logged). The device need not be current.
void unmap_cumem(const CuMemMapping& m);

// For tests and benchmarks: `size` bytes of device memory on `device` laid out as PyTorch's
// expandable segments are: one reserved range backed by separate cuMem allocations of `piece`
// bytes each (rounded up to the allocation granularity), exportable as POSIX fds, readable and
// writable by every GPU that has peer access to `device`. `owner_only`: by `device` alone, and
// GPUDirect RDMA capable where the device supports that with cuMem, as NCCL's buffers are
// (ncclCuMemAlloc). Freed by free_cumem_range.
Result<void*> alloc_cumem_range(int device, size_t size, size_t piece, bool owner_only = false);
void free_cumem_range(void* ptr);

}  // namespace dmx::cuda::driver
