// Rendering of a Topology for `dmx topo`: the tree, GPU x GPU and GPU x NIC matrices (path class,
// P2PDMA distance and map type), advisor recommendations; as text or as JSON text.
#pragma once

#include <string>

#include "topo/topology.h"

namespace dmx::topo {

std::string render_text(const Topology& topo);
std::string render_json(const Topology& topo, int indent = 2);

}  // namespace dmx::topo
