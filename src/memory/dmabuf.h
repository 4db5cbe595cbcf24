// dmabuf export of device memory (for devmem TCP and, later, RDMA).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/sys.h"
#include "dmx/memory.h"

namespace dmx {

struct DmabufExport {
  UniqueFd fd;          // the dmabuf; closing it drops this reference
  size_t offset = 0;    // where region.ptr lies inside the dmabuf (the range is page-aligned)
  size_t size = 0;      // bytes covered by the dmabuf
  bool pcie_mapping = false;  // exported with CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE (BAR1)
};

// Exports the page-aligned range covering `region` (CUDA device memory) as a dmabuf
// (cuMemGetHandleForAddressRange, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD; the PCIe mapping flag is
// tried first where the driver supports it). Code::kUnavailable with the exact reason otherwise.
Result<DmabufExport> export_dmabuf(MemRegion region);

}  // namespace dmx
