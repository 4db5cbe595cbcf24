// dmabuf export of CUDA device memory (CUDA builds; dmabuf_stub.cc otherwise).
//
// The driver exports whole host pages of one allocation: the range handed to
// cuMemGetHandleForAddressRange is the page-aligned span covering the region, and the caller
// learns where region.ptr lies inside it. The PCIe (BAR1) mapping flag is asked for first where
// the driver knows it (CUDA 12.8+): on platforms with a faster coherent link (Grace C2C) the
// default mapping may not be reachable by a PCIe NIC. Where the flag is refused the plain
// mapping is used, and DmabufExport::pcie_mapping says which one the caller got.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>

#include "core/log.h"
#include "memory/backend.h"
#include "memory/cuda/driver.h"
#include "memory/cuda/runtime.h"
#include "memory/dmabuf.h"

namespace dmx {

namespace drv = cuda::driver;

Result<DmabufExport> export_dmabuf(MemRegion region) {
  if (region.where.kind != MemKind::kCuda)
    return Status(Code::kInvalidArgument,
                  fmt::format("export_dmabuf: {} memory cannot be exported; it needs CUDA device memory", to_string(region.where)));
  if (region.ptr == nullptr || region.size == 0)
    return Status(Code::kInvalidArgument, "export_dmabuf: empty region");
  const int device = region.where.device;
  DMX_RETURN_IF_ERROR(cuda::check_device(device));

  // The region must lie inside one allocation of the device it claims.
  DMX_ASSIGN_OR_RETURN(drv::AllocationRange alloc, drv::allocation_range(region.ptr));
  const auto start = reinterpret_cast<uintptr_t>(region.ptr);
  if (alloc.device != device)
    return Status(Code::kInvalidArgument,
                  fmt::format("export_dmabuf: {} belongs to cuda:{}, not cuda:{}", region.ptr, alloc.device, device));
  if (start < alloc.base || region.size > alloc.size - (start - alloc.base))
    return Status(Code::kOutOfRange, fmt::format("export_dmabuf: [{}, +{}) runs past its allocation [{:#x}, +{})",
                                                 region.ptr, region.size, alloc.base, alloc.size));

  // Precise reasons before trying: too old a driver, or a device/driver without dmabuf.
  DMX_ASSIGN_OR_RETURN(int version, drv::driver_version());
  if (version < 11070)
    return Status(Code::kUnavailable, fmt::format("dmabuf export needs CUDA driver 11.7 or later; this driver is {}.{}",
                                                  version / 1000, (version % 1000) / 10));
  auto supported = drv::device_attribute(device, drv::DeviceAttribute::kDmaBufSupported);
  if (!supported.ok())
    return Status(Code::kUnavailable, fmt::format("cuda:{}: cannot ask whether dmabuf is supported: {}", device,
                                                  supported.status().message()));
  if (*supported == 0)
    return Status(Code::kUnavailable,
                  fmt::format("cuda:{} does not support dmabuf export (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED=0: it needs "
                              "the NVIDIA open kernel modules and a kernel with dmabuf support)",
                              device));

  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = start / page * page;
  const uintptr_t end = (start + region.size + page - 1) / page * page;
  const bool inside = begin >= alloc.base && end <= alloc.base + alloc.size;

  cuda::DeviceGuard guard(device);
  DMX_RETURN_IF_ERROR(guard.status());
  int fd = -1;
  bool pcie = drv::knows_pcie_mapping_flag(version);
  drv::DriverError first;
  if (pcie) {
    first = drv::get_dmabuf_fd(reinterpret_cast<void*>(begin), end - begin, true, &fd);
    if (!first.ok()) pcie = false;
  }
  drv::DriverError err;
  if (!pcie) err = drv::get_dmabuf_fd(reinterpret_cast<void*>(begin), end - begin, false, &fd);
  if (!err.ok()) {
    std::string why = err.text;
    if (!first.ok()) why = fmt::format("{}; with the PCIe mapping flag: {}", why, first.text);
    if (!inside)
      why += fmt::format(" (the page-aligned range [{:#x}, {:#x}) crosses the edge of its allocation [{:#x}, +{}): "
                         "allocate memory to be exported in whole pages)",
                         begin, end, alloc.base, alloc.size);
    Code code = Code::kIo;
    if (err.kind == drv::DriverError::kNotSupported || err.kind == drv::DriverError::kNotFound) code = Code::kUnavailable;
    if (err.kind == drv::DriverError::kInvalidValue) code = Code::kInvalidArgument;
    if (err.kind == drv::DriverError::kOutOfMemory) code = Code::kResourceExhausted;
    return Status(code, fmt::format("cuda:{}: dmabuf export failed: {}", device, why));
  }
  // The mapping chosen is logged once per process at info level (a silent fallback is a bug).
  static std::atomic<bool> logged{false};
  if (!logged.exchange(true)) {
    if (pcie)
      DMX_LOG_INFO("cuda:{}: dmabuf export uses the PCIe (BAR1) mapping", device);
    else if (!first.ok())
      DMX_LOG_INFO("cuda:{}: dmabuf export uses the default mapping; the PCIe mapping flag was refused: {}", device,
                   first.text);
    else
      DMX_LOG_INFO("cuda:{}: dmabuf export uses the default mapping (driver {}.{} predates the PCIe mapping flag)",
                   device, version / 1000, (version % 1000) / 10);
  }
  (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);

  DmabufExport out;
  out.fd = UniqueFd(fd);
  out.offset = static_cast<size_t>(start - begin);
  out.size = static_cast<size_t>(end - begin);
  out.pcie_mapping = pcie;
  return out;
}

}  // namespace dmx
