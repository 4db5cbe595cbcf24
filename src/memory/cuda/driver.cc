// The only file in dmx that includes <cuda.h>. See driver.h for why.
#include "memory/cuda/driver.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "core/log.h"
#include "memory/cuda/runtime.h"

namespace dmx::cuda::driver {
namespace {

// One resolved driver entry point: the function, or why it is missing.
template <typename Fn>
struct Symbol {
  Fn fn = nullptr;
  Status missing;  // non-ok when fn == nullptr
};

// `version` is the CUDA version that introduced the signature dmx calls (the _vNNNN suffix of
// its PFN_ typedef in cudaTypedefs.h), so that any driver that has that signature qualifies.
template <typename Fn>
Symbol<Fn> resolve(const char* name, unsigned version) {
  Symbol<Fn> s;
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  cudaError_t err = cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &found);
  const char* how = "cudaGetDriverEntryPointByVersion";
#else
  cudaError_t err = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &found);
  const char* how = "cudaGetDriverEntryPoint";
#endif
  if (err != cudaSuccess) {
    s.missing = cuda::error_status(fmt::format("{}({})", how, name), -1, err);
    s.missing = Status(Code::kUnavailable, s.missing.message());
    return s;
  }
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    int drv = 0;
    (void)cudaDriverGetVersion(&drv);
    s.missing = Status(Code::kUnavailable,
                       fmt::format("the CUDA driver ({}.{}) is too old: it has no {} (needs CUDA {}.{} or later; {} said {})",
                                   drv / 1000, (drv % 1000) / 10, name, version / 1000, (version % 1000) / 10, how,
                                   found == cudaDriverEntryPointVersionNotSufficent ? "version not sufficient"
                                                                                    : "symbol not found"));
    return s;
  }
  s.fn = reinterpret_cast<Fn>(fn);
  return s;
}

#define DMX_DRIVER_SYMBOL(name, version)                                              \
  ([]() -> const Symbol<PFN_##name##_v##version>& {                                   \
    static const Symbol<PFN_##name##_v##version> s =                                  \
        resolve<PFN_##name##_v##version>(#name, version);                             \
    return s;                                                                         \
  }())

// "CUDA_ERROR_NOT_SUPPORTED (operation not supported)"
std::string result_text(CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  const auto& get_name = DMX_DRIVER_SYMBOL(cuGetErrorName, 6000);
  const auto& get_text = DMX_DRIVER_SYMBOL(cuGetErrorString, 6000);
  if (get_name.fn != nullptr) (void)get_name.fn(r, &name);
  if (get_text.fn != nullptr) (void)get_text.fn(r, &text);
  return fmt::format("{} ({})", name != nullptr ? name : fmt::format("CUresult {}", static_cast<int>(r)),
                     text != nullptr ? text : "no description");
}

DriverError make_error(std::string_view call, CUresult r) {
  DriverError e;
  if (r == CUDA_SUCCESS) return e;
  e.code = static_cast<int>(r);
  switch (r) {
    case CUDA_ERROR_INVALID_VALUE: e.kind = DriverError::kInvalidValue; break;
    case CUDA_ERROR_NOT_SUPPORTED: e.kind = DriverError::kNotSupported; break;
    case CUDA_ERROR_OUT_OF_MEMORY: e.kind = DriverError::kOutOfMemory; break;
    default: e.kind = DriverError::kOther; break;
  }
  e.text = fmt::format("{} failed: {}", call, result_text(r));
  return e;
}

DriverError missing_error(const Status& why) {
  DriverError e;
  e.kind = DriverError::kNotFound;
  e.text = why.message();
  return e;
}

Result<CUdevice> device_handle(int ordinal) {
  const auto& get = DMX_DRIVER_SYMBOL(cuDeviceGet, 2000);
  if (get.fn == nullptr) return get.missing;
  CUdevice dev = 0;
  CUresult r = get.fn(&dev, ordinal);
  if (r != CUDA_SUCCESS) return make_error(fmt::format("cuDeviceGet({})", ordinal), r).to_status(Code::kIo);
  return dev;
}

}  // namespace

Status DriverError::to_status(Code code_if_error) const {
  if (ok()) return Status();
  Code c = code_if_error;
  if (kind == kNotFound || kind == kNotSupported) c = Code::kUnavailable;
  if (kind == kOutOfMemory) c = Code::kResourceExhausted;
  return Status(c, text);
}

Result<int> driver_version() {
  int v = 0;
  DMX_CUDA_RETURN_IF_ERROR("cudaDriverGetVersion", -1, cudaDriverGetVersion(&v));
  if (v == 0) return Status(Code::kUnavailable, "no CUDA driver is installed (cudaDriverGetVersion reports 0)");
  return v;
}

Result<void*> primary_context(int device) {
  const auto& retain = DMX_DRIVER_SYMBOL(cuDevicePrimaryCtxRetain, 7000);
  if (retain.fn == nullptr) return retain.missing;
  DMX_ASSIGN_OR_RETURN(CUdevice dev, device_handle(device));
  CUcontext ctx = nullptr;
  CUresult r = retain.fn(&ctx, dev);
  if (r != CUDA_SUCCESS)
    return make_error(fmt::format("cuDevicePrimaryCtxRetain(cuda:{})", device), r).to_status(Code::kIo);
  return static_cast<void*>(ctx);
}

ContextGuard::ContextGuard(void* ctx) {
  const auto& get = DMX_DRIVER_SYMBOL(cuCtxGetCurrent, 4000);
  const auto& set = DMX_DRIVER_SYMBOL(cuCtxSetCurrent, 4000);
  if (get.fn == nullptr || set.fn == nullptr) {
    status_ = get.fn == nullptr ? get.missing : set.missing;
    return;
  }
  CUcontext current = nullptr;
  CUresult r = get.fn(&current);
  if (r != CUDA_SUCCESS) {
    status_ = make_error("cuCtxGetCurrent", r).to_status(Code::kIo);
    return;
  }
  if (current == static_cast<CUcontext>(ctx)) return;
  r = set.fn(static_cast<CUcontext>(ctx));
  if (r != CUDA_SUCCESS) {
    status_ = make_error("cuCtxSetCurrent", r).to_status(Code::kIo);
    return;
  }
  previous_ = current;
  restore_ = true;
}

ContextGuard::~ContextGuard() {
  if (restore_) (void)DMX_DRIVER_SYMBOL(cuCtxSetCurrent, 4000).fn(static_cast<CUcontext>(previous_));
}

Result<int> device_attribute(int device, DeviceAttribute attribute) {
  CUdevice_attribute a = CU_DEVICE_ATTRIBUTE_PCI_BUS_ID;
  const char* name = "";
  switch (attribute) {
    case DeviceAttribute::kDmaBufSupported: a = CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED; name = "DMA_BUF_SUPPORTED"; break;
    case DeviceAttribute::kGpuDirectRdmaSupported:
      a = CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED;
      name = "GPU_DIRECT_RDMA_SUPPORTED";
      break;
    case DeviceAttribute::kPciBusId: a = CU_DEVICE_ATTRIBUTE_PCI_BUS_ID; name = "PCI_BUS_ID"; break;
    case DeviceAttribute::kPciDeviceId: a = CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID; name = "PCI_DEVICE_ID"; break;
    case DeviceAttribute::kPciDomainId: a = CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID; name = "PCI_DOMAIN_ID"; break;
    case DeviceAttribute::kVirtualMemoryManagementSupported:
      a = CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED;
      name = "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED";
      break;
    case DeviceAttribute::kGpuDirectRdmaWithCudaVmmSupported:
      a = CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED;
      name = "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED";
      break;
    case DeviceAttribute::kPosixFdHandleSupported:
      a = CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED;
      name = "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED";
      break;
  }
  const auto& get = DMX_DRIVER_SYMBOL(cuDeviceGetAttribute, 2000);
  if (get.fn == nullptr) return get.missing;
  DMX_ASSIGN_OR_RETURN(CUdevice dev, device_handle(device));
  int value = 0;
  CUresult r = get.fn(&value, a, dev);
  if (r != CUDA_SUCCESS)
    return make_error(fmt::format("cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_{}) on cuda:{}", name, device), r)
        .to_status(Code::kIo);
  return value;
}

Result<AllocationRange> allocation_range(const void* ptr) {
  const auto& attr = DMX_DRIVER_SYMBOL(cuPointerGetAttribute, 4000);
  if (attr.fn == nullptr) return attr.missing;
  const auto& range = DMX_DRIVER_SYMBOL(cuMemGetAddressRange, 3020);
  if (range.fn == nullptr) return range.missing;
  auto dptr = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(ptr));

  unsigned int type = 0;
  CUresult r = attr.fn(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dptr);
  if (r == CUDA_ERROR_INVALID_VALUE || (r == CUDA_SUCCESS && type != CU_MEMORYTYPE_DEVICE))
    return Status(Code::kInvalidArgument, fmt::format("{} is not CUDA device memory", ptr));
  if (r != CUDA_SUCCESS)
    return make_error(fmt::format("cuPointerGetAttribute({}, MEMORY_TYPE)", ptr), r).to_status(Code::kIo);

  AllocationRange out;
  r = attr.fn(&out.device, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dptr);
  if (r != CUDA_SUCCESS)
    return make_error(fmt::format("cuPointerGetAttribute({}, DEVICE_ORDINAL)", ptr), r).to_status(Code::kIo);
  // cuMemGetAddressRange looks the pointer up in the calling thread's current context: make the
  // owning device's primary context current (a pointer on cuda:1 asked under cuda:0 is NOT_FOUND,
  // seen on 2xH200).
  DeviceGuard guard(out.device);
  DMX_RETURN_IF_ERROR(guard.status());
  CUdeviceptr base = 0;
  size_t size = 0;
  r = range.fn(&base, &size, dptr);
  if (r != CUDA_SUCCESS) return make_error(fmt::format("cuMemGetAddressRange({})", ptr), r).to_status(Code::kIo);
  out.base = static_cast<uintptr_t>(base);
  out.size = size;
  return out;
}

Result<uint64_t> buffer_id(const void* ptr) {
  const auto& attr = DMX_DRIVER_SYMBOL(cuPointerGetAttribute, 4000);
  if (attr.fn == nullptr) return attr.missing;
  unsigned long long id = 0;  // NOLINT(google-runtime-int): the attribute's type
  CUresult r = attr.fn(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(ptr)));
  if (r == CUDA_ERROR_INVALID_VALUE) return Status(Code::kInvalidArgument, fmt::format("{} is not CUDA memory", ptr));
  if (r != CUDA_SUCCESS)
    return make_error(fmt::format("cuPointerGetAttribute({}, BUFFER_ID)", ptr), r).to_status(Code::kIo);
  return static_cast<uint64_t>(id);
}

DriverError get_dmabuf_fd(void* ptr, size_t size, bool pcie_mapping, int* fd) {
  const auto& get = DMX_DRIVER_SYMBOL(cuMemGetHandleForAddressRange, 11070);
  if (get.fn == nullptr) return missing_error(get.missing);
  unsigned long long flags = 0;
#if CUDA_VERSION >= 12080
  if (pcie_mapping) flags = CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE;
#else
  if (pcie_mapping) {
    DriverError e;
    e.kind = DriverError::kNotSupported;
    e.text = "dmx was built with CUDA headers older than 12.8, which lack CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE";
    return e;
  }
#endif
  int out = -1;
  CUresult r = get.fn(&out, static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(ptr)), size,
                      CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, flags);
  if (r != CUDA_SUCCESS)
    return make_error(fmt::format("cuMemGetHandleForAddressRange({}, {} B, DMA_BUF_FD, flags={})", ptr, size,
                                  pcie_mapping ? "DMA_BUF_MAPPING_TYPE_PCIE" : "0"),
                      r);
  *fd = out;
  return DriverError();
}

bool knows_pcie_mapping_flag(int driver_version) { return driver_version >= 12080; }

// ---- cuMem allocations ----

namespace {

// Resolves the cuMem entry points dmx uses, or says which one is missing.
struct CuMemApi {
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 export_handle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 import_handle = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuMemRetainAllocationHandle_v11000 retain = nullptr;
  PFN_cuPointerGetAttribute_v4000 attribute = nullptr;
  Status missing;
};

const CuMemApi& cumem_api() {
  static const CuMemApi api = [] {
    CuMemApi a;
    auto take = [&](auto& slot, const auto& symbol) {
      slot = symbol.fn;
      if (symbol.fn == nullptr && a.missing.ok()) a.missing = symbol.missing;
    };
    take(a.create, DMX_DRIVER_SYMBOL(cuMemCreate, 10020));
    take(a.release, DMX_DRIVER_SYMBOL(cuMemRelease, 10020));
    take(a.reserve, DMX_DRIVER_SYMBOL(cuMemAddressReserve, 10020));
    take(a.address_free, DMX_DRIVER_SYMBOL(cuMemAddressFree, 10020));
    take(a.map, DMX_DRIVER_SYMBOL(cuMemMap, 10020));
    take(a.unmap, DMX_DRIVER_SYMBOL(cuMemUnmap, 10020));
    take(a.set_access, DMX_DRIVER_SYMBOL(cuMemSetAccess, 10020));
    take(a.export_handle, DMX_DRIVER_SYMBOL(cuMemExportToShareableHandle, 10020));
    take(a.import_handle, DMX_DRIVER_SYMBOL(cuMemImportFromShareableHandle, 10020));
    take(a.granularity, DMX_DRIVER_SYMBOL(cuMemGetAllocationGranularity, 10020));
    take(a.retain, DMX_DRIVER_SYMBOL(cuMemRetainAllocationHandle, 11000));
    take(a.attribute, DMX_DRIVER_SYMBOL(cuPointerGetAttribute, 4000));
    return a;
  }();
  return api;
}

CUdeviceptr dev_ptr(const void* p) {
  return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p));
}

CUmemAccessDesc access_for(int device) {
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = device;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return a;
}

// A reserved address range with `mapped` blocks of `piece` bytes mapped from its start: what
// alloc_cumem_range makes, and what import_cumem_fd maps (one block).
struct CuMemRange {
  CUdeviceptr va = 0;  // 0: nothing reserved yet
  size_t size = 0;     // reserved
  size_t piece = 0;
  std::vector<CUmemGenericAllocationHandle> blocks;  // owned handles
  size_t mapped = 0;
};

// Undoes a range as far as it got: unmaps its mapped blocks, releases every handle, frees the
// reservation. Returns the first failure.
CUresult undo(const CuMemApi& api, const CuMemRange& range) {
  CUresult first = CUDA_SUCCESS;
  auto note = [&](CUresult r) {
    if (first == CUDA_SUCCESS) first = r;
  };
  for (size_t i = 0; i < range.mapped; ++i) note(api.unmap(range.va + i * range.piece, range.piece));
  for (CUmemGenericAllocationHandle h : range.blocks) note(api.release(h));
  if (range.va != 0) note(api.address_free(range.va, range.size));
  return first;
}

// alloc_cumem_range's ranges, by base.
std::mutex g_ranges_mu;
std::map<uintptr_t, CuMemRange> g_ranges;

}  // namespace

Status cumem_ipc_supported(int device) {
  const CuMemApi& api = cumem_api();
  if (!api.missing.ok()) return Status(Code::kUnavailable, api.missing.message());
  DMX_ASSIGN_OR_RETURN(int vmm, device_attribute(device, DeviceAttribute::kVirtualMemoryManagementSupported));
  if (vmm == 0)
    return Status(Code::kUnavailable, fmt::format("cuda:{} has no virtual memory management (cuMem)", device));
  DMX_ASSIGN_OR_RETURN(int fd, device_attribute(device, DeviceAttribute::kPosixFdHandleSupported));
  if (fd == 0)
    return Status(Code::kUnavailable, fmt::format("cuda:{} cannot share cuMem allocations as POSIX fds", device));
  return Status();
}

Status cumem_fd_exportable(const void* ptr) {
  const CuMemApi& api = cumem_api();
  if (!api.missing.ok()) return Status(Code::kUnavailable, api.missing.message());
  CUdeviceptr p = dev_ptr(ptr);
  unsigned int managed = 0;
  if (api.attribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p) == CUDA_SUCCESS && managed != 0)
    return Status(Code::kUnavailable, fmt::format("{} is managed memory (cudaMallocManaged)", ptr));
  CUmemoryPool pool = nullptr;
  if (api.attribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p) == CUDA_SUCCESS && pool != nullptr)
    return Status(Code::kUnavailable,
                  fmt::format("{} comes from a stream-ordered memory pool (cudaMallocAsync), which is shared by "
                              "exporting the pool, not the allocation",
                              ptr));
  unsigned long long types = 0;  // NOLINT(google-runtime-int): the attribute's type
  CUresult r = api.attribute(&types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, p);
  if (r != CUDA_SUCCESS)
    return make_error(fmt::format("cuPointerGetAttribute({}, ALLOWED_HANDLE_TYPES)", ptr), r)
        .to_status(Code::kUnavailable);
  if ((types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0)
    return Status(Code::kUnavailable,
                  fmt::format("{} is not a cuMem allocation exportable as a POSIX fd (its allowed handle types are "
                              "0x{:x}; a cuMemCreate allocation needs CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in "
                              "requestedHandleTypes)",
                              ptr, types));
  return Status();
}

Result<bool> legacy_ipc_capable(const void* ptr) {
  const CuMemApi& api = cumem_api();
  if (!api.missing.ok()) return Status(Code::kUnavailable, api.missing.message());
  unsigned int capable = 0;
  CUresult r = api.attribute(&capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, dev_ptr(ptr));
  if (r != CUDA_SUCCESS)
    return make_error(fmt::format("cuPointerGetAttribute({}, IS_LEGACY_CUDA_IPC_CAPABLE)", ptr), r)
        .to_status(Code::kUnavailable);
  return capable != 0;
}

Result<UniqueFd> export_cumem_fd(const void* ptr) {
  const CuMemApi& api = cumem_api();
  if (!api.missing.ok()) return Status(Code::kUnavailable, api.missing.message());
  CUmemGenericAllocationHandle h = 0;
  CUresult r = api.retain(&h, const_cast<void*>(ptr));
  if (r != CUDA_SUCCESS)
    return make_error(fmt::format("cuMemRetainAllocationHandle({})", ptr), r).to_status(Code::kUnavailable);
  int fd = -1;
  r = api.export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  (void)api.release(h);  // the retain's reference; the mapping keeps the allocation
  if (r != CUDA_SUCCESS)
    return make_error(fmt::format("cuMemExportToShareableHandle({}, POSIX_FILE_DESCRIPTOR)", ptr), r)
        .to_status(Code::kUnavailable);
  return UniqueFd(fd);
}

Result<CuMemMapping> import_cumem_fd(int fd, size_t size, int device) {
  const CuMemApi& api = cumem_api();
  if (!api.missing.ok()) return Status(Code::kUnavailable, api.missing.message());
  CuMemRange range;
  range.size = range.piece = size;
  auto fail = [&](CUresult r, const std::string& call) -> Status {
    (void)undo(api, range);
    return make_error(call, r).to_status(Code::kIo);
  };
  CUmemGenericAllocationHandle h = 0;
  CUresult r = api.import_handle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS) return fail(r, fmt::format("cuMemImportFromShareableHandle(fd {})", fd));
  range.blocks.push_back(h);
  if (r = api.reserve(&range.va, size, 0, 0, 0); r != CUDA_SUCCESS)
    return fail(r, fmt::format("cuMemAddressReserve({} B)", size));
  if (r = api.map(range.va, size, 0, h, 0); r != CUDA_SUCCESS)
    return fail(r, fmt::format("cuMemMap({} B of an imported allocation)", size));
  range.mapped = 1;
  CUmemAccessDesc access = access_for(device);
  if (r = api.set_access(range.va, size, &access, 1); r != CUDA_SUCCESS)
    return fail(r, fmt::format("cuMemSetAccess({} B, cuda:{})", size, device));
  return CuMemMapping{static_cast<uintptr_t>(range.va), size, h};
}

void unmap_cumem(const CuMemMapping& m) {
  const CuMemApi& api = cumem_api();
  if (!api.missing.ok() || m.base == 0) return;
  CuMemRange range;
  range.va = static_cast<CUdeviceptr>(m.base);
  range.size = range.piece = m.size;
  range.blocks = {m.handle};
  range.mapped = 1;
  if (CUresult r = undo(api, range); r != CUDA_SUCCESS)
    DMX_LOG_WARN("unmapping an imported cuMem allocation ({} B at 0x{:x}): {}", m.size, m.base, result_text(r));
}

Result<void*> alloc_cumem_range(int device, size_t size, size_t piece, bool owner_only) {
  const CuMemApi& api = cumem_api();
  if (!api.missing.ok()) return Status(Code::kUnavailable, api.missing.message());
  DeviceGuard guard(device);  // the primary context, for the range's first use
  DMX_RETURN_IF_ERROR(guard.status());
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  if (owner_only) {
    auto rdma = device_attribute(device, DeviceAttribute::kGpuDirectRdmaWithCudaVmmSupported);
    if (rdma.ok() && *rdma != 0) prop.allocFlags.gpuDirectRDMACapable = 1;
  }
  size_t g = 0;
  CUresult r = api.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != CUDA_SUCCESS) return make_error("cuMemGetAllocationGranularity", r).to_status(Code::kIo);
  CuMemRange range;
  range.piece = std::max(g, (piece + g - 1) / g * g);
  size_t blocks = std::max<size_t>(1, (size + range.piece - 1) / range.piece);
  range.size = blocks * range.piece;
  auto fail = [&](CUresult why, const std::string& call) -> Status {
    (void)undo(api, range);
    return make_error(call, why).to_status(why == CUDA_ERROR_OUT_OF_MEMORY ? Code::kResourceExhausted : Code::kIo);
  };
  if (r = api.reserve(&range.va, range.size, 0, 0, 0); r != CUDA_SUCCESS)
    return fail(r, fmt::format("cuMemAddressReserve({} B)", range.size));
  for (size_t i = 0; i < blocks; ++i) {
    CUmemGenericAllocationHandle h = 0;
    if (r = api.create(&h, range.piece, &prop, 0); r != CUDA_SUCCESS)
      return fail(r, fmt::format("cuMemCreate({} B on cuda:{})", range.piece, device));
    range.blocks.push_back(h);
    if (r = api.map(range.va + i * range.piece, range.piece, 0, h, 0); r != CUDA_SUCCESS) return fail(r, "cuMemMap");
    range.mapped = i + 1;
  }
  std::vector<CUmemAccessDesc> access{access_for(device)};
  int n = 0;
  if (!owner_only && cudaGetDeviceCount(&n) == cudaSuccess)
    for (int d = 0; d < n; ++d) {
      int can = 0;
      if (d != device && cudaDeviceCanAccessPeer(&can, d, device) == cudaSuccess && can)
        access.push_back(access_for(d));
    }
  if (r = api.set_access(range.va, range.size, access.data(), access.size()); r != CUDA_SUCCESS)
    return fail(r, "cuMemSetAccess");
  auto base = static_cast<uintptr_t>(range.va);
  std::lock_guard lock(g_ranges_mu);
  g_ranges.emplace(base, std::move(range));
  return reinterpret_cast<void*>(base);
}

void free_cumem_range(void* ptr) {
  CuMemRange range;
  {
    std::lock_guard lock(g_ranges_mu);
    auto it = g_ranges.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == g_ranges.end()) {
      DMX_LOG_WARN("free_cumem_range({}): not a range of alloc_cumem_range", ptr);
      return;
    }
    range = std::move(it->second);
    g_ranges.erase(it);
  }
  if (CUresult r = undo(cumem_api(), range); r != CUDA_SUCCESS)
    DMX_LOG_WARN("freeing a cuMem range ({} B at {}): {}", range.size, ptr, result_text(r));
}

}  // namespace dmx::cuda::driver
