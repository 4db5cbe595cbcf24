// Rendering of a Topology for `dmx topo`: the tree, GPU x GPU and GPU x NIC matrices (path class,
// P2PDMA distance and map type), advisor recommendations; as text or as JSON text.
#pragma once

#include <string>
#include <vector>

#include "topo/orchestrator.h"
#include "topo/topology.h"

namespace dmx::topo {

// gpu_nics: the setting of that name (NIC per GPU, advisor.h nic_for_gpu).
std::string render_text(const Topology& topo, const std::string& gpu_nics = "");
std::string render_json(const Topology& topo, int indent = 2, const std::string& gpu_nics = "");
// The orchestrator's pools: what is published, how much is allocated and to whom (and, for p2pmem
// BARs, what the kernel says every process holds).
std::string render_pools_text(const Topology& topo, const std::vector<PoolUsage>& pools);
std::string render_pools_json(const Topology& topo, const std::vector<PoolUsage>& pools, int indent = 2);

}  // namespace dmx::topo
