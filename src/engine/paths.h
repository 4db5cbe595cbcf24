// The data paths this engine can choose between endpoints, each "available" or "unavailable: why"
// (for `dmx probe`): the streams every endpoint has, then every registered transport
// (engine/transports.h).
#pragma once

#include <vector>

#include "core/capability.h"
#include "core/config.h"

namespace dmx {

std::vector<Capability> probe_engine_paths(const Config& config);

}  // namespace dmx
