// The only file in dmx that includes <cuda.h>. See driver.h for why.
#include "memory/cuda/driver.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

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

}  // namespace dmx::cuda::driver
