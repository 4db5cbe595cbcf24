#include "topo/distance.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace dmx::topo {

namespace {

// drivers/pci/p2pdma.c pci_p2pdma_whitelist[] (Linux 6.18). PCI_ANY_ID is kAny.
constexpr uint32_t kAny = 0x10000;
struct WhitelistEntry {
  uint16_t vendor;
  uint32_t device;
  bool same_host_bridge_only;
  const char* what;
};
constexpr WhitelistEntry kWhitelist[] = {
    {0x8086, 0x3c00, true, "Intel Xeon E5/Core i7"},
    {0x8086, 0x3c01, true, "Intel Xeon E5/Core i7"},
    {0x8086, 0x2f00, true, "Intel Xeon E7 v3/Xeon E5 v3/Core i7"},
    {0x8086, 0x2f01, true, "Intel Xeon E7 v3/Xeon E5 v3/Core i7"},
    {0x8086, 0x2030, false, "Intel Skylake-E"},
    {0x8086, 0x2031, false, "Intel Skylake-E"},
    {0x8086, 0x2032, false, "Intel Skylake-E"},
    {0x8086, 0x2033, false, "Intel Skylake-E"},
    {0x8086, 0x2020, false, "Intel Skylake-E"},
    {0x8086, 0x09a2, false, "Intel Ice Lake-SP"},
    {0x8086, 0x0b25, false, "Intel DSA (Sapphire Rapids)"},
    {0x8086, 0x0cfe, false, "Intel IAA (Sapphire Rapids)"},
    {0x8086, 0x11fb, false, "Intel DSA (Granite Rapids-D)"},
    {0x8086, 0x1212, false, "Intel DSA (Diamond Rapids)"},
    {0x8086, 0x1216, false, "Intel IAA (Diamond Rapids)"},
    {0x8086, 0x4940, false, "Intel QAT 4xxx"},
    {0x8086, 0x4942, false, "Intel QAT 401xx"},
    {0x8086, 0x4944, false, "Intel QAT 402xx"},
    {0x8086, 0x4946, false, "Intel QAT 420xx"},
    {0x8086, 0x4948, false, "Intel QAT 6xxx"},
    {0x1ae0, kAny, false, "Google SoC"},
};

bool in_range(const Topology& t, int i) {
  return i >= 0 && i < static_cast<int>(t.devices.size());
}

}  // namespace

std::string_view map_type_name(MapType m) {
  switch (m) {
    case MapType::kUnknown:
      return "UNKNOWN";
    case MapType::kNotSupported:
      return "NOT_SUPPORTED";
    case MapType::kBusAddr:
      return "BUS_ADDR";
    case MapType::kThruHostBridge:
      return "THRU_HOST_BRIDGE";
  }
  return "UNKNOWN";
}

std::string_view path_class_name(PathClass c) {
  switch (c) {
    case PathClass::kLoc:
      return "LOC";
    case PathClass::kNvl:
      return "NVL";
    case PathClass::kPix:
      return "PIX";
    case PathClass::kPxb:
      return "PXB";
    case PathClass::kPhb:
      return "PHB";
    case PathClass::kSys:
      return "SYS";
    case PathClass::kUnknown:
      return "unknown";
  }
  return "unknown";
}

bool cpu_supports_p2pdma(const CpuInfo& cpu) {
  return cpu.arch == "x86" && cpu.vendor == "AMD" && cpu.family >= 0x17;
}

bool host_bridge_whitelisted(const Topology& topo, const HostBridge& hb, bool same_host_bridge, std::string* why) {
  if (hb.root_device < 0) {
    *why = fmt::format("{} has no devfn 00.0 or root-port device first on its root bus", hb.name);
    return false;
  }
  const PciDevice& root = topo.devices[hb.root_device];
  if (!root.ids_known) {
    *why = fmt::format("{}: ids of {} unknown", hb.name, root.addr.to_string());
    return false;
  }
  for (const WhitelistEntry& e : kWhitelist) {
    if (e.vendor != root.vendor || (e.device != kAny && e.device != root.device)) continue;
    if (e.same_host_bridge_only && !same_host_bridge) {
      *why = fmt::format("{} {:04x}:{:04x} ({}) is whitelisted only within one host bridge", hb.name, root.vendor,
                         root.device, e.what);
      return false;
    }
    *why = fmt::format("{} {:04x}:{:04x} ({}) is in the P2PDMA whitelist", hb.name, root.vendor, root.device, e.what);
    return true;
  }
  *why =
      fmt::format("host bridge {:04x}:{:04x} of {} is not in the P2PDMA whitelist", root.vendor, root.device, hb.name);
  return false;
}

P2pdmaResult p2pdma_distance(const Topology& topo, int provider, int client) {
  P2pdmaResult r;
  if (!in_range(topo, provider) || !in_range(topo, client)) {
    r.reason = "not a PCI device of this topology";
    return r;
  }
  auto check_acs = [&](int dev) {
    auto redir = topo.devices[dev].acs_redirects();
    if (!redir)
      r.acs_unknown.push_back(dev);
    else if (*redir)
      r.acs_devices.push_back(dev);
  };
  std::vector<int> pc = topo.chain(provider);
  std::vector<int> cc = topo.chain(client);
  int dist_a = 0, dist_b = 0;
  bool found = false;
  for (int a : pc) {
    dist_b = 0;
    check_acs(a);  // before the membership test: the common bridge itself counts
    for (int b : cc) {
      if (a == b) {
        found = true;
        r.common = a;
        break;
      }
      ++dist_b;
    }
    if (found) break;
    ++dist_a;
  }
  r.distance = dist_a + dist_b;
  bool acs_redirects = false;
  if (found) {
    for (int b : cc) {
      if (b == r.common) break;
      check_acs(b);
    }
    if (r.acs_devices.empty()) {
      r.map = MapType::kBusAddr;
      r.reason =
          fmt::format("common upstream {} ; no ACS redirect on the path", topo.devices[r.common].addr.to_string());
    } else {
      acs_redirects = true;
    }
  }
  std::string unknown_note;
  if (!r.acs_unknown.empty()) {
    std::vector<std::string> names;
    for (int d : r.acs_unknown) names.push_back(topo.devices[d].addr.to_string());
    unknown_note = fmt::format("; ACS state unknown for {} (config space unreadable: run as root), assumed off",
                               fmt::join(names, ","));
  }
  if (r.map == MapType::kBusAddr) {
    r.reason += unknown_note;
    return r;
  }
  std::string path_note;
  if (acs_redirects) {
    std::vector<std::string> names;
    for (int d : r.acs_devices) names.push_back(topo.devices[d].addr.to_string());
    path_note = fmt::format("ACS redirect set on {} forces the path through the host bridge (pci=disable_acs_redir={})",
                            fmt::join(names, ","), fmt::join(names, ";"));
  } else {
    path_note = "no common upstream bridge: the path goes through the host bridge";
  }
  r.map = MapType::kThruHostBridge;
  if (cpu_supports_p2pdma(topo.cpu)) {
    r.reason = fmt::format("{}; allowed: AMD family {:#x} CPU (Zen or later)", path_note, topo.cpu.family);
  } else {
    const HostBridge* ha = topo.host_bridge_of(provider);
    const HostBridge* hb = topo.host_bridge_of(client);
    std::string why_a, why_b;
    bool ok = false;
    if (ha == nullptr || hb == nullptr) {
      why_a = "host bridge unknown";
    } else if (ha == hb) {
      ok = host_bridge_whitelisted(topo, *ha, true, &why_a);
    } else {
      ok = host_bridge_whitelisted(topo, *ha, false, &why_a) && host_bridge_whitelisted(topo, *hb, false, &why_b);
    }
    std::string cpu = topo.cpu.vendor == "unknown" ? "CPU unknown" : fmt::format("{} CPU", topo.cpu.vendor);
    std::string whys = why_b.empty() ? why_a : why_a + "; " + why_b;
    if (ok) {
      r.reason = fmt::format("{}; allowed: {}", path_note, whys);
    } else {
      r.map = MapType::kNotSupported;
      r.reason = fmt::format("{}; not allowed: {} and {}", path_note, cpu, whys);
    }
  }
  r.reason += unknown_note;
  return r;
}

DistanceMany p2pdma_distance_many(const Topology& topo, int provider, std::span<const int> clients) {
  DistanceMany m;
  int total = 0;
  bool not_supported = false;
  for (int c : clients) {
    P2pdmaResult r = p2pdma_distance(topo, provider, c);
    if (r.map == MapType::kNotSupported || r.map == MapType::kUnknown)
      not_supported = true;
    else
      total += r.distance;
    m.per_client.push_back(std::move(r));
  }
  m.total = not_supported || clients.empty() ? -1 : total;
  return m;
}

PathInfo path_class(const Topology& topo, int a, int b) {
  PathInfo p;
  if (!in_range(topo, a) || !in_range(topo, b)) {
    p.why = "not a PCI device of this topology";
    return p;
  }
  if (a == b) {
    p.cls = PathClass::kLoc;
    p.why = "same device";
    return p;
  }
  if (const CudaPeerLink* l = topo.cuda_link(a, b); l != nullptr && l->nvlink()) {
    p.cls = PathClass::kNvl;
    p.why = "CUDA reports peer access with native atomics (NVLink)";
    return p;
  }
  std::vector<int> ca = topo.chain(a), cb = topo.chain(b);
  int common = -1;
  for (int x : ca)
    if (std::find(cb.begin(), cb.end(), x) != cb.end()) {
      common = x;
      break;
    }
  int na = topo.numa_of(a), nb = topo.numa_of(b);
  if (common < 0 || topo.devices[common].port_type == PortType::kRootPort) {
    bool same_hb = topo.devices[a].host_bridge == topo.devices[b].host_bridge;
    if (na >= 0 && nb >= 0 && na != nb) {
      p.cls = PathClass::kSys;
      p.why = fmt::format("across NUMA nodes {} and {}", na, nb);
    } else {
      p.cls = PathClass::kPhb;
      p.why = common >= 0 ? fmt::format("through root port {}", topo.devices[common].addr.to_string())
              : same_hb   ? fmt::format("through host bridge {}", topo.devices[a].host_bridge)
                          : fmt::format("through host bridges {} and {}", topo.devices[a].host_bridge,
                                        topo.devices[b].host_bridge);
      if (!same_hb && (na < 0 || nb < 0)) p.why += " (NUMA node unknown)";
    }
    return p;
  }
  // Below the root complex: count the switches the path crosses (each upstream port is one).
  std::vector<int> ups;
  auto add = [&](int d) {
    if (d >= 0 && topo.devices[d].port_type == PortType::kSwitchUpstream &&
        std::find(ups.begin(), ups.end(), d) == ups.end())
      ups.push_back(d);
  };
  for (const auto* c : {&ca, &cb})
    for (size_t i = 1; i < c->size() && (*c)[i] != common; ++i) add((*c)[i]);
  add(common);
  if (topo.devices[common].port_type == PortType::kSwitchDownstream) add(topo.devices[common].upstream);
  p.switches = static_cast<int>(ups.size());
  p.cls = p.switches <= 1 ? PathClass::kPix : PathClass::kPxb;
  p.why = fmt::format("common upstream {} ({}); {} switch{} on the path", topo.devices[common].addr.to_string(),
                      port_type_name(topo.devices[common].port_type), p.switches, p.switches == 1 ? "" : "es");
  return p;
}

}  // namespace dmx::topo
