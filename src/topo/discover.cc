// Discovery: reads the sysfs subset dmx needs into a Topology.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <map>

#include "topo/topology.h"

namespace dmx::topo {

namespace {

constexpr int kMaxDepth = 32;

std::string basename_of(std::string_view path) {
  size_t slash = path.rfind('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

std::string dirname_of(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? std::string() : std::string(path.substr(0, slash));
}

std::optional<int64_t> parse_dec(std::string_view s) {
  int64_t v = 0;
  if (s.empty()) return std::nullopt;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v, 10);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<uint32_t> parse_hex_attr(std::string_view s) {
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s.remove_prefix(2);
  uint32_t v = 0;
  if (s.empty() || s.size() > 8) return std::nullopt;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// "pci0000:00" -> domain 0, bus 0
bool parse_root_bus(std::string_view name, uint32_t* domain, uint32_t* bus) {
  if (name.size() != 10 || name.substr(0, 3) != "pci" || name[7] != ':') return false;
  auto d = parse_hex_attr(name.substr(3, 4));
  auto b = parse_hex_attr(name.substr(8, 2));
  if (!d || !b) return false;
  *domain = *d;
  *bus = *b;
  return true;
}

struct RawDevice {
  PciDevice dev;
  std::string parent_path;  // empty on a root bus
};

void walk(const SysfsTree& tree, const std::string& dir, const std::string& host, const std::string& parent, int depth,
          std::vector<RawDevice>* out, std::vector<std::string>* warnings) {
  if (depth > kMaxDepth) {
    warnings->push_back(fmt::format("{}: PCI tree deeper than {} levels; not descending further", dir, kMaxDepth));
    return;
  }
  for (const std::string& name : tree.list(dir)) {
    auto addr = PciAddress::parse(name);
    if (!addr) continue;
    std::string path = dir + "/" + name;
    if (!tree.is_real_dir(path)) continue;  // links such as virtfnN are not children
    RawDevice raw;
    raw.dev.addr = *addr;
    raw.dev.path = path;
    raw.dev.host_bridge = host;
    raw.parent_path = parent;
    out->push_back(std::move(raw));
    walk(tree, path, host, path, depth + 1, out, warnings);
  }
}

void read_attrs(const SysfsTree& tree, PciDevice& d) {
  auto hex = [&](const char* attr) -> std::optional<uint32_t> {
    auto text = tree.read(d.path + "/" + attr);
    if (!text.ok()) {
      d.problems.push_back(fmt::format("{}: {}", attr, text.status().message()));
      return std::nullopt;
    }
    auto v = parse_hex_attr(*text);
    if (!v) d.problems.push_back(fmt::format("{}: garbage '{}'", attr, text->substr(0, 32)));
    return v;
  };
  auto vendor = hex("vendor");
  auto device = hex("device");
  auto cls = hex("class");
  if (vendor && device && cls && *vendor <= 0xffff && *device <= 0xffff) {
    d.ids_known = true;
    d.vendor = static_cast<uint16_t>(*vendor);
    d.device = static_cast<uint16_t>(*device);
    d.class_code = *cls & 0xffffff;
  }
  if (auto t = tree.read(d.path + "/numa_node"); t.ok()) {
    auto v = parse_dec(*t);
    if (v && *v >= -1 && *v < 4096)
      d.numa_node = static_cast<int>(*v);
    else
      d.problems.push_back(fmt::format("numa_node: garbage '{}'", t->substr(0, 32)));
  }
  if (auto t = tree.read(d.path + "/local_cpulist"); t.ok()) d.local_cpulist = *t;
  auto width = [&](const char* attr) {
    auto t = tree.read(d.path + "/" + attr);
    if (!t.ok()) return -1;
    auto v = parse_dec(*t);
    if (!v || *v < 0 || *v > 64) {
      d.problems.push_back(fmt::format("{}: garbage '{}'", attr, t->substr(0, 32)));
      return -1;
    }
    return static_cast<int>(*v);
  };
  if (auto t = tree.read(d.path + "/current_link_speed"); t.ok() && link_gts(*t) > 0) d.link.cur_speed = *t;
  if (auto t = tree.read(d.path + "/max_link_speed"); t.ok() && link_gts(*t) > 0) d.link.max_speed = *t;
  d.link.cur_width = width("current_link_width");
  d.link.max_width = width("max_link_width");
  if (auto t = tree.read_link(d.path + "/driver"); t.ok()) d.driver = basename_of(*t);
  if (auto bytes = tree.read_bytes(d.path + "/config", 4096); bytes.ok()) {
    d.config = parse_config(*bytes);
    d.config_read = true;
    if (!d.config.problem.empty()) d.problems.push_back("config: " + d.config.problem);
  } else if (bytes.status().code() != Code::kNotFound) {
    d.problems.push_back("config: " + bytes.status().message());
  }
  if (tree.exists(d.path + "/p2pmem")) {
    d.p2pmem.present = true;
    if (auto t = tree.read(d.path + "/p2pmem/size"); t.ok())
      if (auto v = parse_dec(*t); v && *v >= 0) d.p2pmem.size = static_cast<uint64_t>(*v);
    if (auto t = tree.read(d.path + "/p2pmem/available"); t.ok())
      if (auto v = parse_dec(*t); v && *v >= 0) d.p2pmem.available = static_cast<uint64_t>(*v);
    if (auto t = tree.read(d.path + "/p2pmem/published"); t.ok()) d.p2pmem.published = *t == "1";
  }
}

DeviceKind classify(const PciDevice& d) {
  if (!d.ids_known) return DeviceKind::kOther;
  uint32_t cls = d.class_code >> 8;  // class + subclass
  uint32_t base = cls >> 8;
  if (cls == 0x0600) return DeviceKind::kHostBridge;
  if (cls == 0x0604 || cls == 0x0609) return DeviceKind::kBridge;
  if (base == 0x03 && (d.vendor == 0x10de || d.vendor == 0x1002)) return DeviceKind::kGpu;
  if (base == 0x02) return DeviceKind::kNic;
  if (d.class_code == 0x010802) return DeviceKind::kNvme;
  if (base == 0x12) return DeviceKind::kAccelerator;
  return DeviceKind::kOther;
}

void read_numa(const SysfsTree& tree, Topology& topo) {
  for (const std::string& name : tree.list("devices/system/node")) {
    if (name.size() < 5 || name.compare(0, 4, "node") != 0) continue;
    auto id = parse_dec(std::string_view(name).substr(4));
    if (!id || *id < 0) continue;
    NumaNode node;
    node.id = static_cast<int>(*id);
    std::string dir = "devices/system/node/" + name;
    if (auto t = tree.read(dir + "/cpulist"); t.ok()) node.cpulist = *t;
    if (auto t = tree.read(dir + "/meminfo"); t.ok()) {
      size_t at = t->find("MemTotal:");
      if (at != std::string::npos) {
        std::string rest = t->substr(at + 9);
        size_t b = rest.find_first_not_of(' ');
        size_t e = rest.find(' ', b);
        if (b != std::string::npos)
          if (auto v = parse_dec(rest.substr(b, e == std::string::npos ? std::string::npos : e - b)); v && *v >= 0)
            node.mem_total_kib = static_cast<uint64_t>(*v);
      }
    }
    if (auto t = tree.read(dir + "/distance"); t.ok()) {
      std::string_view s = *t;
      while (!s.empty()) {
        size_t sp = s.find(' ');
        if (auto v = parse_dec(s.substr(0, sp)); v && *v >= 0 && *v < 256)
          node.distances.push_back(static_cast<int>(*v));
        s = sp == std::string_view::npos ? std::string_view() : s.substr(sp + 1);
      }
    }
    topo.numa.push_back(std::move(node));
  }
  std::sort(topo.numa.begin(), topo.numa.end(), [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });
}

void read_cpu(const SysfsTree& tree, Topology& topo) {
  topo.cpu = CpuInfo{"unknown", "unknown", -1, "devices/system/cpu/modalias"};
  auto t = tree.read("devices/system/cpu/modalias");
  if (!t.ok()) {
    topo.cpu.source = "unknown: " + t.status().message();
    return;
  }
  // "cpu:type:x86,ven0002fam001Amod0002:feature:..." (x86); "cpu:type:aarch64:feature:..."
  std::string_view s = *t;
  if (s.substr(0, 9) != "cpu:type:") {
    topo.cpu.source = "unknown: garbage modalias";
    return;
  }
  s.remove_prefix(9);
  if (s.substr(0, 4) == "x86,") {
    topo.cpu.arch = "x86";
    size_t v = s.find("ven");
    size_t f = s.find("fam");
    if (v != std::string_view::npos && v + 7 <= s.size()) {
      if (auto ven = parse_hex_attr(s.substr(v + 3, 4))) {
        // X86_VENDOR_* numbering of arch/x86/include/asm/processor.h
        switch (*ven) {
          case 0:
            topo.cpu.vendor = "Intel";
            break;
          case 2:
            topo.cpu.vendor = "AMD";
            break;
          case 5:
            topo.cpu.vendor = "Centaur";
            break;
          case 9:
            topo.cpu.vendor = "Hygon";
            break;
          case 10:
            topo.cpu.vendor = "Zhaoxin";
            break;
          default:
            topo.cpu.vendor = fmt::format("x86 vendor {}", *ven);
            break;
        }
      }
    }
    if (f != std::string_view::npos && f + 7 <= s.size())
      if (auto fam = parse_hex_attr(s.substr(f + 3, 4))) topo.cpu.family = static_cast<int>(*fam);
  } else {
    topo.cpu.arch = std::string(s.substr(0, s.find(':')));
  }
}

// The PCI device whose directory is the deepest prefix of `path` (a resolved class/ link).
int device_for_path(const Topology& topo, const std::map<std::string, int>& by_path, std::string path) {
  while (!path.empty()) {
    if (auto it = by_path.find(path); it != by_path.end()) return it->second;
    path = dirname_of(path);
  }
  return -1;
}

}  // namespace

Result<Topology> discover(const std::string& root) {
  return discover(SysfsTree(root));
}

Result<Topology> discover(const SysfsTree& tree) {
  if (!tree.exists("")) return Status(Code::kNotFound, fmt::format("sysfs root {} does not exist", tree.root()));
  if (!tree.is_real_dir("devices") && !tree.exists("devices"))
    return Status(Code::kInvalidArgument,
                  fmt::format("{} is not a sysfs tree: it has no devices/ directory", tree.root()));
  Topology topo;
  topo.root = tree.root();

  // 1. PCI: every root bus directory devices/pciDDDD:BB (or one level below, as on some ARM
  // platforms), walked down through BDF-named directories.
  std::vector<RawDevice> raw;
  std::vector<std::string> roots;
  for (const std::string& name : tree.list("devices")) {
    uint32_t d, b;
    if (parse_root_bus(name, &d, &b)) roots.push_back("devices/" + name);
  }
  for (const std::string& plat : tree.list("devices/platform"))
    for (const std::string& name : tree.list("devices/platform/" + plat)) {
      uint32_t d, b;
      if (parse_root_bus(name, &d, &b)) roots.push_back("devices/platform/" + plat + "/" + name);
    }
  for (const std::string& r : roots) {
    HostBridge hb;
    hb.name = basename_of(r);
    parse_root_bus(hb.name, &hb.domain, &hb.bus);
    topo.host_bridges.push_back(hb);
    walk(tree, r, hb.name, "", 0, &raw, &topo.warnings);
  }
  if (roots.empty())
    topo.warnings.push_back(fmt::format("{}: no PCI root bus (devices/pciDDDD:BB) found", tree.root()));
  std::sort(raw.begin(), raw.end(), [](const RawDevice& a, const RawDevice& b) { return a.dev.addr < b.dev.addr; });
  std::map<std::string, int> by_path;
  for (size_t i = 0; i < raw.size(); ++i) by_path[raw[i].dev.path] = static_cast<int>(i);
  for (RawDevice& r : raw) {
    if (!r.parent_path.empty()) r.dev.parent = by_path.at(r.parent_path);
    read_attrs(tree, r.dev);
    r.dev.kind = classify(r.dev);
    topo.devices.push_back(std::move(r.dev));
  }
  // Virtual functions: the kernel's pci_upstream_bridge() walks from the PF.
  for (PciDevice& d : topo.devices) {
    d.upstream = d.parent;
    if (!tree.exists(d.path + "/physfn")) continue;
    auto pf = tree.resolve(d.path + "/physfn");
    if (!pf.ok()) {
      d.problems.push_back("physfn: " + pf.status().message());
      continue;
    }
    auto it = by_path.find(*pf);
    if (it == by_path.end()) {
      d.problems.push_back("physfn: " + *pf + " is not a PCI device of this tree");
      continue;
    }
    d.physfn = it->second;
  }
  for (PciDevice& d : topo.devices)
    if (d.physfn >= 0) d.upstream = topo.devices[d.physfn].parent;
  // Port types: config space when readable, else the tree's shape.
  for (PciDevice& d : topo.devices) {
    if (d.config_read && d.config.port_type != PortType::kUnknown) {
      d.port_type = d.config.port_type;
      continue;
    }
    d.port_type_inferred = true;
    if (d.kind != DeviceKind::kBridge) {
      d.port_type = d.kind == DeviceKind::kHostBridge ? PortType::kRcEndpoint : PortType::kEndpoint;
      continue;
    }
    const PciDevice* up = d.parent >= 0 ? &topo.devices[d.parent] : nullptr;
    if (up == nullptr)
      d.port_type = PortType::kRootPort;
    else if (up->port_type == PortType::kSwitchUpstream)
      d.port_type = PortType::kSwitchDownstream;
    else
      d.port_type = PortType::kSwitchUpstream;
  }
  // Host bridges: the device the kernel's whitelist looks at, and a NUMA node.
  for (HostBridge& hb : topo.host_bridges) {
    int first = -1;
    for (size_t i = 0; i < topo.devices.size(); ++i) {
      const PciDevice& d = topo.devices[i];
      if (d.host_bridge != hb.name) continue;
      if (d.parent < 0 && d.physfn < 0 && (first < 0 || d.addr.devfn() < topo.devices[first].addr.devfn()))
        first = static_cast<int>(i);
      if (hb.numa_node < 0 && d.numa_node >= 0) hb.numa_node = d.numa_node;
    }
    if (first >= 0 && (topo.devices[first].addr.devfn() == 0 || topo.devices[first].port_type == PortType::kRootPort))
      hb.root_device = first;
  }
  for (size_t i = 0; i < topo.devices.size(); ++i)
    if (topo.devices[i].kind == DeviceKind::kGpu) topo.gpus.push_back(static_cast<int>(i));

  // 2. Network interfaces, RDMA devices, NVMe controllers: class/ links into the device tree.
  std::vector<Nic> virtual_nics;
  for (const std::string& name : tree.list("class/net")) {
    Nic nic;
    nic.name = name;
    auto where = tree.resolve("class/net/" + name);
    if (!where.ok()) {
      topo.warnings.push_back(fmt::format("class/net/{}: {}", name, where.status().message()));
      continue;
    }
    nic.pci = device_for_path(topo, by_path, *where);
    auto num = [&](const char* attr) {
      auto t = tree.read(*where + "/" + attr);
      if (!t.ok()) return -1;
      auto v = parse_dec(*t);
      return v && *v >= 0 && *v < (1ll << 31) ? static_cast<int>(*v) : -1;
    };
    nic.ifindex = num("ifindex");
    nic.mtu = num("mtu");
    nic.speed_mbps = num("speed");
    if (auto t = tree.read(*where + "/operstate"); t.ok()) nic.operstate = *t;
    if (nic.pci >= 0) {
      nic.driver = topo.devices[nic.pci].driver;
      topo.nics.push_back(std::move(nic));
    } else {
      virtual_nics.push_back(std::move(nic));
    }
  }
  for (Nic& n : virtual_nics) topo.nics.push_back(std::move(n));
  for (const std::string& name : tree.list("class/infiniband")) {
    auto where = tree.resolve("class/infiniband/" + name);
    if (where.ok()) tree.list(*where);  // so that a capture holds the link's target
    RdmaDevice r{name, where.ok() ? device_for_path(topo, by_path, *where) : -1};
    for (Nic& n : topo.nics)
      if (r.pci >= 0 && n.pci == r.pci) n.rdma.push_back(name);
    topo.rdma.push_back(std::move(r));
  }
  for (const std::string& name : tree.list("class/nvme")) {
    auto where = tree.resolve("class/nvme/" + name);
    if (where.ok()) tree.list(*where);
    topo.nvme.push_back(NvmeController{name, where.ok() ? device_for_path(topo, by_path, *where) : -1});
  }

  // 3. NUMA nodes and the CPU (the P2PDMA rule needs the vendor and family).
  read_numa(tree, topo);
  read_cpu(tree, topo);
  for (const PciDevice& d : topo.devices)
    for (const std::string& p : d.problems) topo.warnings.push_back(d.addr.to_string() + " " + p);
  return topo;
}

}  // namespace dmx::topo
