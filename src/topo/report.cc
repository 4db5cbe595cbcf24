#include "topo/report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/units.h"
#include "topo/advisor.h"
#include "topo/distance.h"

namespace dmx::topo {

namespace {

std::string acs_text(const PciDevice& d) {
  auto r = d.acs_redirects();
  if (!r) return "acs ?";
  if (!d.config.has_acs) return "";
  std::string bits;
  auto bit = [&](uint16_t m, const char* n) {
    if (d.config.acs_ctrl & m) bits += bits.empty() ? n : std::string(",") + n;
  };
  bit(0x0001, "SV");
  bit(0x0002, "TB");
  bit(kAcsRequestRedirect, "RR");
  bit(kAcsCompletionRedirect, "CR");
  bit(0x0010, "UF");
  bit(kAcsEgressControl, "EC");
  bit(0x0040, "DT");
  return fmt::format("acs[{}]{}", bits.empty() ? "-" : bits, *r ? " redirect" : "");
}

std::string link_text(const LinkInfo& l) {
  if (l.cur_speed.empty() && l.max_speed.empty()) return "";
  auto speed = [](const std::string& s) { return s.empty() ? std::string("?") : s.substr(0, s.find(" PCIe")); };
  auto width = [](int w) { return w < 0 ? std::string("?") : std::to_string(w); };
  return fmt::format("link {} x{} (max {} x{})", speed(l.cur_speed), width(l.cur_width), speed(l.max_speed),
                     width(l.max_width));
}

std::string cell(const Topology& t, int a, int b) {
  PathInfo p = path_class(t, a, b);
  P2pdmaResult r = p2pdma_distance(t, a, b);
  return fmt::format("{} {} {}", path_class_name(p.cls), r.distance, map_type_name(r.map));
}

void tree_lines(const Topology& t, int parent, const std::string& hb, int depth, std::string* out) {
  for (size_t i = 0; i < t.devices.size(); ++i) {
    const PciDevice& d = t.devices[i];
    if (d.parent != parent || d.host_bridge != hb) continue;
    std::string extra;
    if (d.kind == DeviceKind::kBridge)
      extra += fmt::format(" {}{}", port_type_name(d.port_type), d.port_type_inferred ? "?" : "");
    if (!d.driver.empty()) extra += " [" + d.driver + "]";
    for (const Nic& n : t.nics)
      if (n.pci == static_cast<int>(i)) extra += " " + n.name;
    for (const RdmaDevice& r : t.rdma)
      if (r.pci == static_cast<int>(i)) extra += " " + r.name;
    for (const NvmeController& n : t.nvme)
      if (n.pci == static_cast<int>(i)) extra += " " + n.name;
    if (int c = t.cuda_ordinal(static_cast<int>(i)); c >= 0) extra += fmt::format(" cuda:{}", c);
    if (d.physfn >= 0) extra += " vf-of " + t.devices[d.physfn].addr.to_string();
    if (d.numa_node >= 0) extra += fmt::format(" numa {}", d.numa_node);
    if (auto l = link_text(d.link); !l.empty()) extra += " " + l;
    if (auto a = acs_text(d); !a.empty()) extra += " " + a;
    if (d.p2pmem.present)
      extra += fmt::format(" p2pmem {}{}", format_size(d.p2pmem.size), d.p2pmem.published ? " published" : "");
    *out += fmt::format("{:{}}{}{}\n", "", 2 * depth, t.label(static_cast<int>(i)), extra);
    tree_lines(t, static_cast<int>(i), hb, depth + 1, out);
  }
}

nlohmann::json pair_json(const Topology& t, int a, int b) {
  PathInfo p = path_class(t, a, b);
  P2pdmaResult r = p2pdma_distance(t, a, b);
  nlohmann::json acs = nlohmann::json::array();
  for (int d : r.acs_devices) acs.push_back(t.devices[d].addr.to_string());
  return {{"a", t.devices[a].addr.to_string()},
          {"b", t.devices[b].addr.to_string()},
          {"path_class", path_class_name(p.cls)},
          {"path_why", p.why},
          {"p2pdma_distance", r.distance},
          {"map_type", map_type_name(r.map)},
          {"acs_redirect", acs},
          {"reason", r.reason}};
}

}  // namespace

std::string render_text(const Topology& t, const std::string& gpu_nics) {
  std::string out;
  out += fmt::format("sysfs root: {}\n", t.root);
  out += fmt::format("CPU: {} {} family {}{}\n", t.cpu.arch, t.cpu.vendor,
                     t.cpu.family >= 0 ? fmt::format("{:#x}", t.cpu.family) : std::string("?"),
                     cpu_supports_p2pdma(t.cpu) ? " (P2PDMA through host bridges allowed: AMD Zen or later)" : "");
  for (const NumaNode& n : t.numa)
    out += fmt::format("NUMA node {}: cpus {}, {}\n", n.id, n.cpulist.empty() ? "?" : n.cpulist,
                       format_size(n.mem_total_kib * 1024));
  if (t.cuda.available) {
    out += fmt::format("CUDA: driver {}, {} device(s)\n", t.cuda.driver_version, t.cuda.devices.size());
    for (const CudaDevice& c : t.cuda.devices)
      out += fmt::format("  cuda:{} {} {} {}\n", c.ordinal, c.name, c.bus_id, format_size(c.total_memory));
  } else {
    out += fmt::format("CUDA overlay: unavailable: {}\n", t.cuda.reason);
  }
  out += "\nPCI tree\n";
  for (const HostBridge& hb : t.host_bridges) {
    out += fmt::format("{}{}{}\n", hb.name, hb.numa_node >= 0 ? fmt::format(" numa {}", hb.numa_node) : "",
                       hb.root_device >= 0 ? " (whitelist checks " + t.devices[hb.root_device].addr.to_string() + ")"
                                           : " (no whitelist device)");
    tree_lines(t, -1, hb.name, 1, &out);
  }
  std::vector<int> nic_devs;
  for (const Nic& n : t.nics)
    if (n.pci >= 0) nic_devs.push_back(n.pci);
  auto matrix = [&](const char* title, const std::vector<int>& rows, const std::vector<int>& cols, bool nic_cols) {
    if (rows.empty() || cols.empty()) return;
    out += fmt::format("\n{} (path class, P2PDMA distance, map type)\n{:14}", title, "");
    for (size_t j = 0; j < cols.size(); ++j) {
      std::string h = nic_cols ? t.nics[j].name : t.devices[cols[j]].addr.to_string();
      out += fmt::format("{:<26}", h);
    }
    out += "\n";
    for (int r : rows) {
      out += fmt::format("{:14}", t.devices[r].addr.to_string());
      for (int c : cols) out += fmt::format("{:<26}", cell(t, r, c));
      out += "\n";
    }
  };
  matrix("GPU x GPU", t.gpus, t.gpus, false);
  matrix("GPU x NIC", t.gpus, nic_devs, true);
  std::vector<Advice> advice = advise_all(t);
  if (!advice.empty()) out += "\nPath advisor (GPU memory <-> network)\n";
  for (const Advice& a : advice)
    out += fmt::format("  {} {} {:7}: {}\n", t.devices[a.gpu].addr.to_string(), t.nics[a.nic].name,
                       direction_name(a.direction), a.why);
  bool rdma_heading = false;
  for (int g : t.gpus) {
    int nic = nearest_rdma_nic(t, g);
    if (nic < 0) continue;
    if (!rdma_heading) out += "\nRDMA per GPU (nearest RDMA NIC; the engine's ranking and the rdma transport use this)\n";
    rdma_heading = true;
    RdmaChoice c = rdma_choice(t, g, nic);
    out += fmt::format("  {} {} ({}): {}\n", t.devices[g].addr.to_string(), t.nics[nic].name,
                       fmt::join(t.nics[nic].rdma, ","), c.why);
  }
  if (!t.gpus.empty()) out += "\nNIC per GPU (TCP streams of a context with nic_gpu; gpu_nics overrides)\n";
  for (size_t i = 0; i < t.gpus.size(); ++i) {
    int g = gpu_of_ordinal(t, static_cast<int>(i));
    if (g < 0) continue;
    NicChoice c = nic_for_gpu(t, g, static_cast<int>(i), gpu_nics);
    out += fmt::format("  cuda:{} {} -> {}: {}\n", i, t.devices[g].addr.to_string(),
                       c.nic >= 0 ? t.nics[c.nic].name : std::string("none"), c.why);
  }
  if (!t.gpus.empty() && !rdma_heading && !t.rdma.empty())
    out += "\nRDMA per GPU: no RDMA device on a PCI function (a software device such as soft-RoCE): no GPUDirect\n";
  if (t.gpus.empty()) out += "\nNo GPUs in this tree: no GPU matrices or advice.\n";
  if (!t.warnings.empty()) {
    out += "\nUnknown or unreadable\n";
    for (const std::string& w : t.warnings) out += "  " + w + "\n";
  }
  return out;
}

std::string render_json(const Topology& t, int indent, const std::string& gpu_nics) {
  using nlohmann::json;
  json j;
  j["sysfs_root"] = t.root;
  j["cpu"] = {{"arch", t.cpu.arch},
              {"vendor", t.cpu.vendor},
              {"family", t.cpu.family},
              {"p2pdma_through_host_bridge", cpu_supports_p2pdma(t.cpu)}};
  j["numa"] = json::array();
  for (const NumaNode& n : t.numa)
    j["numa"].push_back(
        {{"id", n.id}, {"cpulist", n.cpulist}, {"mem_total_kib", n.mem_total_kib}, {"distances", n.distances}});
  j["host_bridges"] = json::array();
  for (const HostBridge& hb : t.host_bridges)
    j["host_bridges"].push_back(
        {{"name", hb.name},
         {"numa_node", hb.numa_node},
         {"whitelist_device", hb.root_device >= 0 ? t.devices[hb.root_device].addr.to_string() : ""}});
  j["devices"] = json::array();
  for (const PciDevice& d : t.devices) {
    auto acs = d.acs_redirects();
    json e = {{"bdf", d.addr.to_string()},
              {"path", d.path},
              {"host_bridge", d.host_bridge},
              {"kind", device_kind_name(d.kind)},
              {"port_type", port_type_name(d.port_type)},
              {"port_type_inferred", d.port_type_inferred},
              {"parent", d.parent >= 0 ? t.devices[d.parent].addr.to_string() : ""},
              {"upstream", d.upstream >= 0 ? t.devices[d.upstream].addr.to_string() : ""},
              {"numa_node", d.numa_node},
              {"driver", d.driver},
              {"link",
               {{"current_speed", d.link.cur_speed},
                {"current_width", d.link.cur_width},
                {"max_speed", d.link.max_speed},
                {"max_width", d.link.max_width}}},
              {"acs", acs ? (*acs ? "redirect" : "no-redirect") : "unknown"},
              {"acs_ctrl", d.config.acs_ctrl},
              {"problems", d.problems}};
    if (d.ids_known) {
      e["vendor"] = fmt::format("{:04x}", d.vendor);
      e["device"] = fmt::format("{:04x}", d.device);
      e["class"] = fmt::format("{:06x}", d.class_code);
    }
    if (d.physfn >= 0) e["physfn"] = t.devices[d.physfn].addr.to_string();
    if (d.config.max_payload) e["max_payload"] = *d.config.max_payload;
    if (d.config.rcb) e["rcb"] = *d.config.rcb;
    if (d.p2pmem.present)
      e["p2pmem"] = {{"size", d.p2pmem.size}, {"available", d.p2pmem.available}, {"published", d.p2pmem.published}};
    j["devices"].push_back(std::move(e));
  }
  j["gpus"] = json::array();
  for (int g : t.gpus)
    j["gpus"].push_back(
        {{"bdf", t.devices[g].addr.to_string()}, {"cuda", t.cuda_ordinal(g)}, {"numa_node", t.numa_of(g)}});
  j["nics"] = json::array();
  for (const Nic& n : t.nics)
    j["nics"].push_back({{"name", n.name},
                         {"bdf", n.pci >= 0 ? t.devices[n.pci].addr.to_string() : ""},
                         {"ifindex", n.ifindex},
                         {"mtu", n.mtu},
                         {"speed_mbps", n.speed_mbps},
                         {"operstate", n.operstate},
                         {"driver", n.driver},
                         {"rdma", n.rdma},
                         {"numa_node", n.pci >= 0 ? t.numa_of(n.pci) : -1}});
  j["rdma"] = json::array();
  for (const RdmaDevice& r : t.rdma)
    j["rdma"].push_back({{"name", r.name}, {"bdf", r.pci >= 0 ? t.devices[r.pci].addr.to_string() : ""}});
  j["nvme"] = json::array();
  for (const NvmeController& n : t.nvme)
    j["nvme"].push_back({{"name", n.name}, {"bdf", n.pci >= 0 ? t.devices[n.pci].addr.to_string() : ""}});
  j["cuda"] = {{"available", t.cuda.available}, {"reason", t.cuda.reason}, {"driver_version", t.cuda.driver_version}};
  j["cuda"]["devices"] = json::array();
  for (const CudaDevice& c : t.cuda.devices)
    j["cuda"]["devices"].push_back(
        {{"ordinal", c.ordinal}, {"name", c.name}, {"bus_id", c.bus_id}, {"total_memory", c.total_memory}});
  j["cuda"]["p2p"] = json::array();
  for (const CudaPeerLink& l : t.cuda.links)
    j["cuda"]["p2p"].push_back({{"a", l.a},
                                {"b", l.b},
                                {"access", l.access},
                                {"native_atomics", l.native_atomics},
                                {"perf_rank", l.perf_rank},
                                {"nvlink", l.nvlink()}});
  j["gpu_gpu"] = json::array();
  for (int a : t.gpus)
    for (int b : t.gpus) j["gpu_gpu"].push_back(pair_json(t, a, b));
  j["nic_per_gpu"] = json::array();
  for (size_t i = 0; i < t.gpus.size(); ++i) {
    int g = gpu_of_ordinal(t, static_cast<int>(i));
    if (g < 0) continue;
    NicChoice c = nic_for_gpu(t, g, static_cast<int>(i), gpu_nics);
    j["nic_per_gpu"].push_back({{"cuda", i}, {"gpu", t.devices[g].addr.to_string()},
                                {"nic", c.nic >= 0 ? t.nics[c.nic].name : std::string()}, {"why", c.why}});
  }
  j["gpu_nic"] = json::array();
  for (int a : t.gpus)
    for (const Nic& n : t.nics)
      if (n.pci >= 0) {
        json p = pair_json(t, a, n.pci);
        p["nic"] = n.name;
        j["gpu_nic"].push_back(std::move(p));
      }
  j["advice"] = json::array();
  for (const Advice& a : advise_all(t))
    j["advice"].push_back({{"gpu", t.devices[a.gpu].addr.to_string()},
                           {"nic", t.nics[a.nic].name},
                           {"direction", direction_name(a.direction)},
                           {"verdict", verdict_name(a.verdict)},
                           {"staging_numa_node", a.staging_numa},
                           {"path_class", path_class_name(a.path.cls)},
                           {"map_type", map_type_name(a.p2pdma.map)},
                           {"p2pdma_distance", a.p2pdma.distance},
                           {"max_payload", a.mps},
                           {"completion_size", a.rcb},
                           {"direct_efficiency", a.direct_efficiency},
                           {"staged_efficiency", a.staged_efficiency},
                           {"why", a.why}});
  j["rdma_per_gpu"] = json::array();
  for (int g : t.gpus)
    if (int nic = nearest_rdma_nic(t, g); nic >= 0) {
      RdmaChoice c = rdma_choice(t, g, nic);
      j["rdma_per_gpu"].push_back({{"gpu", t.devices[g].addr.to_string()},
                                   {"nic", t.nics[nic].name},
                                   {"rdma", t.nics[nic].rdma},
                                   {"gpudirect", c.gpudirect},
                                   {"staging_numa_node", c.staging_numa},
                                   {"why", c.why}});
    }
  j["warnings"] = t.warnings;
  return j.dump(indent);
}

}  // namespace dmx::topo

namespace dmx::topo {

namespace {

std::string pool_where(const Topology& t, const PoolUsage& u) {
  if (u.desc.kind == PoolKind::kPinnedHost) return fmt::format("node {}", u.desc.numa_node);
  if (u.desc.pci >= 0 && u.desc.pci < static_cast<int>(t.devices.size()))
    return t.devices[static_cast<size_t>(u.desc.pci)].addr.to_string();
  return "?";
}

// For a p2pmem BAR: what the kernel says now (every process's allocations, not only ours).
std::string kernel_side(const Topology& t, const PoolUsage& u) {
  if (u.desc.kind != PoolKind::kDeviceBar || u.desc.pci < 0) return {};
  const P2pmemInfo& p = t.devices[static_cast<size_t>(u.desc.pci)].p2pmem;
  return fmt::format("; kernel: {} of {} available, {} allocated by all processes", format_size(p.available),
                     format_size(p.size), format_size(p.size - std::min(p.size, p.available)));
}

}  // namespace

std::string render_pools_text(const Topology& t, const std::vector<PoolUsage>& pools) {
  std::string out =
      "\nMemory pools (published by the orchestrator; TCP staging, devmem's RX pool, TX rings, zcrx areas and "
      "landing zones, and p2pmem are placed from the nearest by the P2PDMA rule, a GPU pool growing by an extent for "
      "a request it has no room for; held by: this process's bookings)\n";
  if (pools.empty()) out += "  none\n";
  for (const PoolUsage& u : pools) {
    out += fmt::format("  {:<28} {:<11} {:<13} capacity {:>9}  used {:>9} in {} allocation(s){}{}\n", u.desc.name,
                       pool_kind_name(u.desc.kind), pool_where(t, u), format_size(u.desc.capacity),
                       format_size(u.used), u.allocations, u.published ? "" : " (unpublished)", kernel_side(t, u));
    for (const auto& [owner, bytes] : u.owners) out += fmt::format("    held by {}: {}\n", owner, format_size(bytes));
  }
  return out;
}

std::string render_pools_json(const Topology& t, const std::vector<PoolUsage>& pools, int indent) {
  using nlohmann::json;
  json a = json::array();
  for (const PoolUsage& u : pools) {
    json owners = json::object();
    for (const auto& [owner, bytes] : u.owners) owners[owner] = bytes;
    json e = {{"name", u.desc.name},        {"kind", std::string(pool_kind_name(u.desc.kind))},
              {"where", pool_where(t, u)},  {"capacity", u.desc.capacity},
              {"used", u.used},             {"peak", u.peak},
              {"allocations", u.allocations}, {"published", u.published},
              {"held_by", owners}};
    if (u.desc.kind == PoolKind::kDeviceBar && u.desc.pci >= 0) {
      const P2pmemInfo& p = t.devices[static_cast<size_t>(u.desc.pci)].p2pmem;
      e["kernel"] = {{"size", p.size}, {"available", p.available}};
    }
    a.push_back(std::move(e));
  }
  return a.dump(indent);
}

}  // namespace dmx::topo
