// dmx_probe: what this host can do. Each check answers "available" or "unavailable: <exact
// reason>" (errno, the kernel's extended ack, the missing piece); `dmx probe` prints them.
//
// The checks are listed in one place, probe.cc's kChecks table, in the order they print; a
// transport adds its line there. A check never throws and never crashes on a machine that lacks
// what it looks for. Thread-compatible: call from one thread at a time.
#pragma once

#include <string>
#include <vector>

#include "core/capability.h"

namespace dmx::probe {

struct ProbeOptions {
  std::string sysfs_root = "/sys";  // topology checks read here
  bool cuda = true;                 // query the CUDA driver (devices, P2P matrix)
  bool devmem = true;               // run the devmem TCP checks (netlink, bind attempts)
};

std::vector<Capability> probe_all(const ProbeOptions& options = {});

// The individual checks (exposed for tests).
std::vector<Capability> probe_kernel();
std::vector<Capability> probe_cuda();
std::vector<Capability> probe_topology(const std::string& sysfs_root);
std::vector<Capability> probe_io_uring_zcrx();
std::vector<Capability> probe_network_namespaces();

}  // namespace dmx::probe
