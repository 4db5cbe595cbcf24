// Seed 002's rule for rdma, per GPU: whether the NIC behind a verbs device should read and write
// that GPU's memory directly (GPUDirect RDMA) or the data should be staged through host memory, by
// the topology advisor (topo/advisor.h) with its PCIe arithmetic in `why`. The verbs device is
// matched to its PCI function through sysfs (<root>/class/infiniband/<dev>/device).
#pragma once

#include <string>
#include <vector>

#include "dmx/status.h"
#include "topo/topology.h"

namespace dmx::rdma {

struct GpuAdvice {
  int ordinal = -1;     // CUDA ordinal (or the position among the tree's GPUs without an overlay)
  bool direct = false;  // both directions favour NIC-direct access
  std::string why;
};

// kNotFound when the device is not a PCI function in the tree (rxe, siw) or there is no GPU.
Result<std::vector<GpuAdvice>> advise_gpus(const topo::Topology& t, const std::string& rdma_device);

}  // namespace dmx::rdma
