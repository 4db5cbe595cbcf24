// The topology advisor's word on devmem (topo/advisor.h): whether NIC-direct access between a GPU
// and the devmem NIC pays, both ways, with its PCIe arithmetic. In auto mode devmem is offered only
// when it does; otherwise staged TCP through host memory near the GPU is the better path, and the
// advisor's reason says why (transport=devmem still forces it).
#pragma once

#include <string>

#include "dmx/status.h"
#include "topo/topology.h"

namespace dmx::devmem {

struct Advice {
  bool direct = false;  // both directions favour NIC-direct access
  std::string why;      // the advisor's reasons, one per direction
};

// `gpu`: the GPU's PCI device index in `t`; `ifname`: the devmem NIC. kNotFound when either is not
// in the tree.
Result<Advice> advise(const topo::Topology& t, int gpu, const std::string& ifname);

// The PCI device index of CUDA device `ordinal`: by the CUDA overlay, else the ordinal-th GPU of
// the tree (a captured tree has no overlay); -1 when there is none.
int gpu_device(const topo::Topology& t, int ordinal);

}  // namespace dmx::devmem
