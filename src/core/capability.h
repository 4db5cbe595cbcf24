// A capability check's answer: "available" or "unavailable: <exact reason>", plus facts.
// Every probe in dmx (transports, CUDA, topology, kernel features) returns these; `dmx probe`
// prints them. A check never throws and never fails silently: unknown is said as unknown.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dmx {

struct Capability {
  std::string name;    // "devmem.bind_rx[eth0]", "cuda.devices", "kernel.version"
  bool available = false;
  std::string detail;  // when available: what was found; when not: the exact reason
  std::vector<std::pair<std::string, std::string>> facts = {};  // extra key/values for --json
};

}  // namespace dmx
