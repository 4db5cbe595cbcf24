#include "topo/topology.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace dmx::topo {

int Topology::find(const PciAddress& addr) const {
  for (size_t i = 0; i < devices.size(); ++i)
    if (devices[i].addr == addr) return static_cast<int>(i);
  return -1;
}

int Topology::find(std::string_view bdf) const {
  std::string lower(bdf);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower.size() == 7) lower = "0000:" + lower;  // "03:00.0"
  auto addr = PciAddress::parse(lower);
  return addr ? find(*addr) : -1;
}

const HostBridge* Topology::host_bridge_of(int dev) const {
  if (dev < 0 || dev >= static_cast<int>(devices.size())) return nullptr;
  for (const HostBridge& hb : host_bridges)
    if (hb.name == devices[dev].host_bridge) return &hb;
  return nullptr;
}

int Topology::numa_index(int node_id) const {
  for (size_t i = 0; i < numa.size(); ++i)
    if (numa[i].id == node_id) return static_cast<int>(i);
  return -1;
}

int Topology::numa_of(int dev) const {
  if (dev < 0 || dev >= static_cast<int>(devices.size())) return -1;
  if (devices[dev].numa_node >= 0) return devices[dev].numa_node;
  if (const HostBridge* hb = host_bridge_of(dev); hb != nullptr && hb->numa_node >= 0) return hb->numa_node;
  if (numa.size() == 1) return numa[0].id;
  return -1;
}

std::vector<int> Topology::chain(int dev) const {
  std::vector<int> out;
  for (int d = dev; d >= 0 && out.size() <= devices.size(); d = devices[d].upstream) out.push_back(d);
  return out;
}

int Topology::nic_by_name(std::string_view name) const {
  for (size_t i = 0; i < nics.size(); ++i)
    if (nics[i].name == name) return static_cast<int>(i);
  return -1;
}

int Topology::cuda_ordinal(int dev) const {
  for (const CudaDevice& c : cuda.devices)
    if (c.pci == dev && dev >= 0) return c.ordinal;
  return -1;
}

int Topology::device_of_cuda(int ordinal) const {
  for (const CudaDevice& c : cuda.devices)
    if (c.ordinal == ordinal) return c.pci;
  return -1;
}

const CudaPeerLink* Topology::cuda_link(int dev_a, int dev_b) const {
  int a = cuda_ordinal(dev_a), b = cuda_ordinal(dev_b);
  if (a < 0 || b < 0) return nullptr;
  for (const CudaPeerLink& l : cuda.links)
    if (l.a == a && l.b == b) return &l;
  return nullptr;
}

std::string Topology::label(int dev) const {
  if (dev < 0 || dev >= static_cast<int>(devices.size())) return "?";
  const PciDevice& d = devices[dev];
  if (!d.ids_known) return fmt::format("{} {} (ids unknown)", d.addr.to_string(), device_kind_name(d.kind));
  return fmt::format("{} {} {} {:04x}", d.addr.to_string(), device_kind_name(d.kind), vendor_name(d.vendor), d.device);
}

Result<std::shared_ptr<const Topology>> discover_local(const std::string& sysfs_root) {
  DMX_ASSIGN_OR_RETURN(Topology t, discover(sysfs_root));
  if (sysfs_root == "/sys" || sysfs_root == "/sys/") {
    apply_cuda_overlay(t, query_cuda_overlay());
  } else {
    CudaOverlay none;
    none.reason = "not queried: the sysfs root " + sysfs_root + " is not this machine's /sys";
    apply_cuda_overlay(t, std::move(none));
  }
  return std::shared_ptr<const Topology>(std::make_shared<Topology>(std::move(t)));
}

void apply_cuda_overlay(Topology& topo, CudaOverlay overlay) {
  for (CudaDevice& c : overlay.devices) {
    c.pci = topo.find(c.bus_id);
    if (c.pci < 0 && overlay.available)
      topo.warnings.push_back(
          fmt::format("CUDA device {} ({}) has bus id {} which is not in the sysfs tree", c.ordinal, c.name, c.bus_id));
  }
  topo.cuda = std::move(overlay);
}

}  // namespace dmx::topo
