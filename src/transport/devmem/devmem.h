// The devmem transport's factory header: the only one visible outside this folder.
#pragma once

#include <string>
#include <vector>

#include "core/capability.h"
#include "dmx/status.h"

namespace dmx::devmem {

// Every devmem TCP capability of this host: the netdev generic-netlink family and its bind-rx /
// bind-tx ops, then per NIC an actual bind attempt with the kernel's errno and extack text,
// NIC header-split / ntuple / RSS state, dmabuf export of CUDA memory.
std::vector<Capability> probe();

// For connection-time selection: ok when devmem TCP can be used through `ifname` now (kernel ops,
// NIC configured, driver passes bind-rx and bind-tx device checks, CUDA memory exports as dmabuf),
// else kUnavailable with the first reason, to be logged once and shown in statistics. An empty
// ifname (setting devmem_ifname unset) is "devmem off". Non-destructive, like probe().
//
// The building blocks for the engine live in this folder: region.h (BoundRegion: dmabuf export +
// netlink binding), rx.h (DevmemRx), tx.h (DevmemTx), kernel.h (the seam), nic.h (steering).
Status usable(const std::string& ifname);

}  // namespace dmx::devmem
