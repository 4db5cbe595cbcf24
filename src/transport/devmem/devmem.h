// The devmem transport's factory header: the only one visible outside this folder.
#pragma once

#include <vector>

#include "core/capability.h"

namespace dmx::devmem {

// Every devmem TCP capability of this host: the netdev generic-netlink family and its bind-rx /
// bind-tx ops, then per NIC an actual bind attempt with the kernel's errno and extack text,
// NIC header-split / ntuple / RSS state, dmabuf export of CUDA memory.
std::vector<Capability> probe();

}  // namespace dmx::devmem
