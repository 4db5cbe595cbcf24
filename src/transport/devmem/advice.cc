#include "transport/devmem/advice.h"

#include <fmt/format.h>

#include "topo/advisor.h"

namespace dmx::devmem {

Result<Advice> advise(const topo::Topology& t, int gpu, const std::string& ifname) {
  int nic = t.nic_by_name(ifname);
  if (nic < 0 || t.nics[static_cast<size_t>(nic)].pci < 0)
    return Status(Code::kNotFound, fmt::format("NIC {} is not a PCI device in {}", ifname, t.root));
  if (gpu < 0 || static_cast<size_t>(gpu) >= t.devices.size())
    return Status(Code::kNotFound, fmt::format("no such GPU in {}", t.root));
  Advice out;
  out.direct = true;
  for (topo::Direction d : {topo::Direction::kSend, topo::Direction::kReceive}) {
    topo::Advice a = topo::advise(t, gpu, nic, d);
    out.direct = out.direct && a.verdict == topo::Verdict::kNicDirect;
    out.why += fmt::format("{}{}: {}", out.why.empty() ? "" : "; ", topo::direction_name(d), a.why);
  }
  return out;
}

int gpu_device(const topo::Topology& t, int ordinal) {
  int dev = t.device_of_cuda(ordinal);
  if (dev >= 0) return dev;
  return ordinal >= 0 && static_cast<size_t>(ordinal) < t.gpus.size() ? t.gpus[static_cast<size_t>(ordinal)] : -1;
}

}  // namespace dmx::devmem
