#include "topo/advisor.h"

#include <fmt/format.h>

#include <algorithm>

namespace dmx::topo {

double write_efficiency(uint64_t bytes, uint32_t mps) {
  if (bytes == 0 || mps == 0) return 0;
  uint64_t tlps = (bytes + mps - 1) / mps;
  return static_cast<double>(bytes) / static_cast<double>(bytes + tlps * kMemWriteOverhead);
}

double read_efficiency(uint64_t bytes, uint32_t completion) {
  if (bytes == 0 || completion == 0) return 0;
  uint64_t cpls = (bytes + completion - 1) / completion;
  return static_cast<double>(bytes) / static_cast<double>(bytes + cpls * kCompletionOverhead);
}

std::string_view direction_name(Direction d) {
  return d == Direction::kSend ? "send" : "receive";
}
std::string_view verdict_name(Verdict v) {
  return v == Verdict::kNicDirect ? "nic-direct" : "stage-host";
}

int closest_numa_node(const Topology& topo, int dev) {
  return topo.numa_of(dev);
}

namespace {

// Smallest configured MPS along a device's chain (the path uses the smallest), 0 when none known.
uint32_t path_mps(const Topology& topo, int dev) {
  uint32_t mps = 0;
  for (int d : topo.chain(dev))
    if (auto m = topo.devices[d].config.max_payload; m && (mps == 0 || *m < mps)) mps = *m;
  return mps;
}

// Read completion boundary of the root port above a device (Link Control RCB), 0 when unknown.
uint32_t root_rcb(const Topology& topo, int dev) {
  std::vector<int> c = topo.chain(dev);
  if (c.empty()) return 0;
  const PciDevice& top = topo.devices[c.back()];
  if (top.port_type == PortType::kRootPort && top.config.rcb) return *top.config.rcb;
  return 0;
}

}  // namespace

Advice advise(const Topology& topo, int gpu_dev, int nic_index, Direction dir) {
  Advice a;
  a.gpu = gpu_dev;
  a.nic = nic_index;
  a.direction = dir;
  if (nic_index < 0 || nic_index >= static_cast<int>(topo.nics.size()) || topo.nics[nic_index].pci < 0) {
    a.why = "the NIC is not a PCI device: stage through host memory";
    a.staging_numa = closest_numa_node(topo, gpu_dev);
    return a;
  }
  int nic_dev = topo.nics[nic_index].pci;
  a.path = path_class(topo, gpu_dev, nic_dev);
  a.p2pdma = p2pdma_distance(topo, gpu_dev, nic_dev);
  uint32_t mg = path_mps(topo, gpu_dev), mn = path_mps(topo, nic_dev);
  a.mps = mg && mn ? std::min(mg, mn) : (mg ? mg : (mn ? mn : 256));
  bool through_rc =
      a.path.cls == PathClass::kPhb || a.path.cls == PathClass::kSys || a.p2pdma.map == MapType::kThruHostBridge;
  // Through the root complex completions are split at its RCB; below it the GPU completes in up to
  // MPS-sized pieces (128 B RCB is the device rule, the conservative figure).
  uint32_t rc = root_rcb(topo, gpu_dev);
  a.rcb = through_rc ? (rc ? rc : 64) : std::min<uint32_t>(a.mps, 128);
  constexpr uint64_t kSample = 4096;
  a.staged_efficiency = write_efficiency(kSample, a.mps);
  a.direct_efficiency = dir == Direction::kSend ? read_efficiency(kSample, a.rcb) : write_efficiency(kSample, a.mps);
  int gpu_node = closest_numa_node(topo, gpu_dev);
  int nic_node = closest_numa_node(topo, nic_dev);
  a.staging_numa = gpu_node >= 0 ? gpu_node : nic_node;
  std::string node = a.staging_numa >= 0 ? fmt::format("NUMA node {}", a.staging_numa) : "an unknown NUMA node";
  std::string eff = dir == Direction::kSend
                        ? fmt::format(
                              "NIC reads of GPU memory come back in {} B completions ({:.1f} % of the wire) "
                              "vs {:.1f} % for the GPU's {} B posted writes into host memory",
                              a.rcb, 100 * a.direct_efficiency, 100 * a.staged_efficiency, a.mps)
                        : fmt::format("NIC writes into GPU memory are posted {} B writes ({:.1f} % of the wire)", a.mps,
                                      100 * a.direct_efficiency);
  std::string where = fmt::format("{} {} (P2PDMA {} distance {})", path_class_name(a.path.cls), a.path.why,
                                  map_type_name(a.p2pdma.map), a.p2pdma.distance);
  if (a.p2pdma.map == MapType::kNotSupported) {
    a.verdict = Verdict::kStageHost;
    a.why = fmt::format("stage through pinned host memory on {}: the kernel cannot map this pair ({}); {}", node,
                        a.p2pdma.reason, where);
  } else if (a.path.cls == PathClass::kPix || a.path.cls == PathClass::kPxb) {
    if (a.p2pdma.map == MapType::kBusAddr) {
      a.verdict = Verdict::kNicDirect;
      a.why = fmt::format("NIC-direct: GPU and NIC meet below the root complex, {}; {}", where, eff);
    } else {
      a.verdict = Verdict::kStageHost;
      a.why = fmt::format("stage through pinned host memory on {}: {}; {}", node, a.p2pdma.reason, eff);
    }
  } else {
    a.verdict = Verdict::kStageHost;
    std::string cross = gpu_node >= 0 && nic_node >= 0 && gpu_node != nic_node
                            ? fmt::format(" (the NIC is on node {}: its reads cross the socket link)", nic_node)
                            : "";
    a.why = fmt::format(
        "stage through pinned host memory on {}{}: the path goes {}; peer traffic through the root "
        "complex is slower than staging; {}",
        node, cross, where, eff);
  }
  return a;
}

std::vector<Advice> advise_all(const Topology& topo) {
  std::vector<Advice> out;
  for (int g : topo.gpus)
    for (size_t n = 0; n < topo.nics.size(); ++n) {
      if (topo.nics[n].pci < 0) continue;
      out.push_back(advise(topo, g, static_cast<int>(n), Direction::kSend));
      out.push_back(advise(topo, g, static_cast<int>(n), Direction::kReceive));
    }
  return out;
}

int gpu_of_ordinal(const Topology& topo, int ordinal, std::string* how) {
  if (ordinal < 0) return -1;
  if (topo.cuda.available) {
    int dev = topo.device_of_cuda(ordinal);
    if (how) *how = dev >= 0 ? "by the CUDA driver's bus id" : "not a CUDA device of this topology";
    return dev;
  }
  if (ordinal >= static_cast<int>(topo.gpus.size())) {
    if (how) *how = fmt::format("the topology has {} GPU(s)", topo.gpus.size());
    return -1;
  }
  if (how) *how = "in PCI order (no CUDA overlay)";
  return topo.gpus[static_cast<size_t>(ordinal)];
}

namespace {

int nearest_nic(const Topology& topo, int gpu_dev, bool rdma_only) {
  int best = -1;
  PathClass best_cls = PathClass::kUnknown;
  int best_dist = 0;
  for (size_t n = 0; n < topo.nics.size(); ++n) {
    const Nic& nic = topo.nics[n];
    if (nic.pci < 0 || (rdma_only && nic.rdma.empty())) continue;
    PathClass cls = path_class(topo, gpu_dev, nic.pci).cls;
    int dist = p2pdma_distance(topo, gpu_dev, nic.pci).distance;
    if (dist < 0) dist = 1 << 20;
    if (best < 0 || cls < best_cls || (cls == best_cls && dist < best_dist)) {
      best = static_cast<int>(n);
      best_cls = cls;
      best_dist = dist;
    }
  }
  return best;
}

}  // namespace

int nearest_rdma_nic(const Topology& topo, int gpu_dev) { return nearest_nic(topo, gpu_dev, true); }

NicChoice nic_for_gpu(const Topology& topo, int gpu_dev, int ordinal, const std::string& gpu_nics) {
  NicChoice c;
  // "0=eth0,1=eth1": the user's word first.
  std::string prefix = fmt::format("{}=", ordinal);
  for (size_t pos = 0; pos <= gpu_nics.size();) {
    size_t end = gpu_nics.find(',', pos);
    if (end == std::string::npos) end = gpu_nics.size();
    std::string item = gpu_nics.substr(pos, end - pos);
    if (item.starts_with(prefix)) {
      std::string name = item.substr(prefix.size());
      c.nic = topo.nic_by_name(name);
      c.why = c.nic >= 0 ? fmt::format("set by gpu_nics ({})", item)
                         : fmt::format("gpu_nics names {}, which this host does not have", name);
      return c;
    }
    pos = end + 1;
  }
  c.nic = nearest_nic(topo, gpu_dev, false);
  if (c.nic < 0) {
    c.why = "no NIC on a PCI function";
    return c;
  }
  const Nic& n = topo.nics[static_cast<size_t>(c.nic)];
  PathInfo p = path_class(topo, gpu_dev, n.pci);
  int dist = p2pdma_distance(topo, gpu_dev, n.pci).distance;
  c.why = fmt::format("nearest by PCIe: path class {}, P2PDMA distance {}", path_class_name(p.cls),
                      dist < 0 ? std::string("none") : std::to_string(dist));
  return c;
}

RdmaChoice rdma_choice(const Topology& topo, int gpu_dev, int nic_index) {
  RdmaChoice c;
  Advice send = advise(topo, gpu_dev, nic_index, Direction::kSend);
  Advice recv = advise(topo, gpu_dev, nic_index, Direction::kReceive);
  c.gpudirect = send.verdict == Verdict::kNicDirect && recv.verdict == Verdict::kNicDirect;
  c.staging_numa = send.staging_numa;
  std::string staging =
      c.staging_numa >= 0 ? fmt::format("NUMA node {}", c.staging_numa) : std::string("an unknown NUMA node");
  c.why = fmt::format("{}; send: {}; receive: {}",
                      c.gpudirect ? "GPUDirect (the NIC reads and writes GPU memory)"
                                  : fmt::format("staged through pinned host memory on {}", staging),
                      send.why, recv.why);
  return c;
}

}  // namespace dmx::topo
