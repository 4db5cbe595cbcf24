#include "transport/devmem/region.h"

#include <fmt/format.h>

namespace dmx::devmem {

Result<std::unique_ptr<BoundRegion>> BoundRegion::bind_rx(NetlinkOps& ops, int ifindex,
                                                          std::span<const uint32_t> queues, MemRegion memory,
                                                          const DmabufExporter& exporter) {
  if (queues.empty()) return Status(Code::kInvalidArgument, "devmem bind-rx: no queues given");
  DMX_ASSIGN_OR_RETURN(DmabufExport dmabuf, exporter(memory));
  DMX_ASSIGN_OR_RETURN(auto binding, ops.bind_rx(ifindex, dmabuf.fd.get(), queues));
  return std::unique_ptr<BoundRegion>(new BoundRegion(memory, std::move(dmabuf), std::move(binding)));
}

Result<std::unique_ptr<BoundRegion>> BoundRegion::bind_tx(NetlinkOps& ops, int ifindex, MemRegion memory,
                                                          const DmabufExporter& exporter) {
  DMX_ASSIGN_OR_RETURN(DmabufExport dmabuf, exporter(memory));
  DMX_ASSIGN_OR_RETURN(auto binding, ops.bind_tx(ifindex, dmabuf.fd.get()));
  return std::unique_ptr<BoundRegion>(new BoundRegion(memory, std::move(dmabuf), std::move(binding)));
}

}  // namespace dmx::devmem
