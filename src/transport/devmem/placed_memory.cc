// The landing-zone seam over the machine's placement (devmem.h: placement_landing).
#include <fmt/format.h>

#include "core/units.h"
#include "topo/placement.h"
#include "transport/devmem/devmem.h"

namespace dmx::devmem {

std::function<Result<LandingZone>(uint64_t)> placement_landing(PlacementSource placement, std::string ifname,
                                                               int cuda_device) {
  return [placement = std::move(placement), ifname = std::move(ifname), cuda_device](uint64_t bytes)
             -> Result<LandingZone> {
    DMX_ASSIGN_OR_RETURN(std::shared_ptr<topo::Placement> p, placement());
    std::string owner = fmt::format("devmem landing zone of {}", ifname);
    DMX_ASSIGN_OR_RETURN(topo::GpuBuffer b, p->allocate_landing(ifname, cuda_device, bytes, owner));
    auto keep = std::make_shared<topo::GpuBuffer>(std::move(b));
    LandingZone z;
    z.region = MemRegion{keep->data(), keep->size(), MemSpec{MemKind::kCuda, cuda_device}};
    z.where = fmt::format("GPU pool {} ({}, the pool nearest {} and cuda:{} by the P2PDMA rule; booked to \"{}\")",
                          keep->pool(), format_size(keep->size()), ifname, cuda_device, owner);
    z.keep = std::move(keep);
    return z;
  };
}

}  // namespace dmx::devmem
