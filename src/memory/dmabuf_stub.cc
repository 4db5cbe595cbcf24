// Built when dmx is configured without CUDA: dmabuf export says why it cannot work.
#include "memory/dmabuf.h"

namespace dmx {

Result<DmabufExport> export_dmabuf(MemRegion) {
  return Status(Code::kUnavailable, "dmabuf export of device memory needs CUDA; this dmx was built without it (DMX_ENABLE_CUDA=OFF)");
}

}  // namespace dmx
