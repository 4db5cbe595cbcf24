#include "topo/push.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/units.h"
#include "topo/advisor.h"
#include "topo/topology.h"

namespace dmx::topo {

Result<PushMode> parse_push_mode(std::string_view text) {
  if (text == "auto") return PushMode::kAuto;
  if (text == "on") return PushMode::kOn;
  if (text == "off") return PushMode::kOff;
  return Status(Code::kInvalidArgument, fmt::format("gpu_push must be auto, on or off, not '{}'", text));
}

std::string_view push_mode_name(PushMode mode) {
  switch (mode) {
    case PushMode::kAuto: return "auto";
    case PushMode::kOn: return "on";
    case PushMode::kOff: return "off";
  }
  return "?";
}

std::string_view push_link_name(PushLink link) {
  switch (link) {
    case PushLink::kPeerGpu: return "peer GPU";
    case PushLink::kHostWrite: return "host write";
    case PushLink::kHostRead: return "host read";
  }
  return "?";
}

PushPlan plan_gpu_push(PushMode mode, uint64_t configured_max, const PushFacts& f) {
  PushPlan p;
  if (mode == PushMode::kOff) {
    p.why = "gpu push off (gpu_push=off): every device copy by a copy engine";
    return p;
  }
  if (mode == PushMode::kOn) {
    p.max = kPushLimit;
    p.why = fmt::format("gpu push forced (gpu_push=on): device copies up to {} by the SMs", format_size(p.max));
    return p;
  }
  uint64_t max = std::min(configured_max, kPushLimit);
  if (max == 0) {
    p.why = "gpu push off (gpu_push_max=0)";
    return p;
  }
  uint32_t mps = f.mps == 0 ? 256 : f.mps;
  uint32_t rcb = f.rcb == 0 ? 64 : f.rcb;
  double w = write_efficiency(max, mps) * 100;
  double r = read_efficiency(max, rcb) * 100;
  switch (f.link) {
    case PushLink::kPeerGpu:
      p.max = max;
      p.why = fmt::format("gpu push up to {}: the source GPU's SMs store into the peer's memory (posted writes over "
                          "the peer link), no copy-engine launch (its fixed cost, 5.7-7.4 us for 8 B, is most of a "
                          "small copy); above it the copy engine",
                          format_size(max));
      break;
    case PushLink::kHostWrite:
      p.max = max;
      p.why = fmt::format("gpu push up to {}: the SMs store into pinned host memory (posted writes, {:.0f} % of the "
                          "wire at MPS {} B, as the copy engine's own writes), no copy-engine launch; above it the "
                          "copy engine",
                          format_size(max), w, mps);
      break;
    case PushLink::kHostRead:
      if (f.path_class == "SYS") {
        p.why = fmt::format("no gpu push: the SMs would read host memory across sockets (path SYS): each read's "
                            "completions cross the inter-socket link, twice the path of a write (seed 002); copy "
                            "engine");
        break;
      }
      p.max = std::max<uint64_t>(max / 4, 1);
      p.why = fmt::format("gpu push up to {}: the SMs read pinned host memory (completions of {} B: {:.0f} % of the "
                          "wire against {:.0f} % for writes, and each read waits a round trip{}), so a quarter of "
                          "gpu_push_max; above it the copy engine",
                          format_size(p.max), rcb, r, w,
                          f.path_class.empty() ? "; path class unknown" : ", path " + f.path_class);
      break;
  }
  return p;
}

std::string render_push_text(const Topology& t, PushMode mode, uint64_t configured_max) {
  std::string out = fmt::format("\nGPU push (gpu_push={}, gpu_push_max={}; docs/gpu-push.md){}\n",
                                push_mode_name(mode), format_size(configured_max),
                                mode == PushMode::kOff ? ": off, so every device copy is a copy engine's; with auto:" : "");
  if (mode == PushMode::kOff) mode = PushMode::kAuto;
  if (t.gpus.empty()) return out + "  no GPUs in this tree\n";
  for (int g : t.gpus) {
    PushFacts f;
    f.path_class = "PHB";  // staging lives on the GPU's own NUMA node (topo/placement.h)
    std::vector<int> c = t.chain(g);
    uint32_t mps = 0;  // the smallest along the chain, as the advisor takes it
    for (int d : c)
      if (auto m = t.devices[d].config.max_payload; m && (mps == 0 || *m < mps)) mps = *m;
    if (mps != 0) f.mps = mps;
    if (!c.empty() && t.devices[c.back()].port_type == PortType::kRootPort && t.devices[c.back()].config.rcb)
      f.rcb = *t.devices[c.back()].config.rcb;
    f.link = PushLink::kHostWrite;
    out += fmt::format("  {} staged send: {}\n", t.devices[g].addr.to_string(), plan_gpu_push(mode, configured_max, f).why);
    f.link = PushLink::kHostRead;
    out += fmt::format("  {} staged receive: {}\n", t.devices[g].addr.to_string(),
                       plan_gpu_push(mode, configured_max, f).why);
  }
  if (t.gpus.size() > 1)
    out += fmt::format("  GPU to GPU (cuda_ipc, copy by the source): {}\n",
                       plan_gpu_push(mode, configured_max, push_facts(PushLink::kPeerGpu)).why);
  return out;
}

}  // namespace dmx::topo
