#include "transport/rdma/advice.h"

#include <fmt/format.h>

#include "topo/advisor.h"

namespace dmx::rdma {

Result<std::vector<GpuAdvice>> advise_gpus(const topo::Topology& t, const std::string& rdma_device) {
  int pci = -1;
  for (const topo::RdmaDevice& r : t.rdma)
    if (r.name == rdma_device) pci = r.pci;
  if (pci < 0)
    return Status(Code::kNotFound, fmt::format("{} is not a PCI function in {} (a software device such as rxe, or "
                                               "not there)",
                                               rdma_device, t.root));
  int nic = -1;
  for (size_t i = 0; i < t.nics.size(); ++i)
    if (t.nics[i].pci == pci) nic = static_cast<int>(i);
  if (nic < 0) return Status(Code::kNotFound, fmt::format("{} has no network interface in {}", rdma_device, t.root));
  if (t.gpus.empty()) return Status(Code::kNotFound, fmt::format("no GPU in {}", t.root));
  std::vector<GpuAdvice> out;
  for (size_t g = 0; g < t.gpus.size(); ++g) {
    GpuAdvice a;
    int ordinal = t.cuda_ordinal(t.gpus[g]);
    a.ordinal = ordinal >= 0 ? ordinal : static_cast<int>(g);
    a.direct = true;
    for (topo::Direction d : {topo::Direction::kSend, topo::Direction::kReceive}) {
      topo::Advice x = topo::advise(t, t.gpus[g], nic, d);
      a.direct = a.direct && x.verdict == topo::Verdict::kNicDirect;
      a.why += fmt::format("{}{}: {}", a.why.empty() ? "" : "; ", topo::direction_name(d), x.why);
    }
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace dmx::rdma
