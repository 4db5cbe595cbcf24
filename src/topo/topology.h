// The machine as sysfs describes it: PCI tree, GPUs, NICs, RDMA devices, NVMe, NUMA nodes, CPU,
// and (when CUDA is present) the CUDA devices and their peer-to-peer links.
//
// Discovery never crashes on what it finds: unreadable or garbage attributes become "unknown"
// (with the reason in `problems` / `warnings`); only a root that is not a sysfs tree is an error.
// A Topology is a plain value: copy it, share it read-only between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dmx/status.h"
#include "topo/pci.h"
#include "topo/sysfs.h"

namespace dmx::topo {

struct HostBridge {
  std::string name;  // "pci0000:00"
  uint32_t domain = 0;
  uint32_t bus = 0;
  int root_device = -1;  // the kernel's pci_host_bridge_dev(): first device on the root bus if it is
                         // devfn 00.0 or a root port; the whitelist is checked against it
  int numa_node = -1;    // from the devices below it, -1 unknown
};

struct NumaNode {
  int id = 0;
  std::string cpulist;
  uint64_t mem_total_kib = 0;
  std::vector<int> distances;  // SLIT row, indexed by position in Topology::numa
};

struct CpuInfo {
  std::string arch;    // "x86", "aarch64", "unknown"
  std::string vendor;  // "Intel", "AMD", "Hygon", "Zhaoxin", "unknown"
  int family = -1;     // x86 family, -1 unknown
  std::string source;  // where it came from
};

struct Nic {
  std::string name;  // "eth0"
  int pci = -1;      // device index, -1 for virtual interfaces
  int ifindex = -1;
  int mtu = -1;
  int speed_mbps = -1;  // -1 unknown (virtio and links that are down say nothing)
  std::string operstate;
  std::string driver;             // of the PCI function
  std::vector<std::string> rdma;  // RDMA devices on the same PCI function ("mlx5_0")
};

struct RdmaDevice {
  std::string name;
  int pci = -1;
};

struct NvmeController {
  std::string name;  // "nvme0"
  int pci = -1;
};

struct CudaDevice {
  int ordinal = -1;
  std::string name;
  std::string bus_id;  // "0000:06:00.0"
  uint64_t total_memory = 0;
  int cc_major = 0;
  int cc_minor = 0;
  int pci = -1;  // matched PCI device, -1 when the bus id is not in the tree
};

struct CudaPeerLink {
  int a = -1;  // CUDA ordinals
  int b = -1;
  bool access = false;          // cudaDevP2PAttrAccessSupported
  bool native_atomics = false;  // cudaDevP2PAttrNativeAtomicSupported
  int perf_rank = -1;
  // dmx reads a pair with access and native atomics as NVLink (or C2C): CUDA reports native
  // peer atomics only over those; PCIe peers report access without them.
  bool nvlink() const { return access && native_atomics; }
};

struct CudaOverlay {
  bool available = false;
  std::string reason;  // why not, when unavailable
  int driver_version = 0;
  int runtime_version = 0;
  std::vector<CudaDevice> devices;
  std::vector<CudaPeerLink> links;  // one per ordered pair a != b
};

struct Topology {
  std::string root;
  std::vector<HostBridge> host_bridges;
  std::vector<PciDevice> devices;  // sorted by address
  std::vector<int> gpus;           // device indices
  std::vector<Nic> nics;           // PCI-backed first, then virtual
  std::vector<RdmaDevice> rdma;
  std::vector<NvmeController> nvme;
  std::vector<NumaNode> numa;
  CpuInfo cpu;
  CudaOverlay cuda;
  std::vector<std::string> warnings;  // things discovery could not read, in words

  int find(const PciAddress& addr) const;
  int find(std::string_view bdf) const;
  const HostBridge* host_bridge_of(int dev) const;
  // NUMA node of a device: its own numa_node, else its host bridge's, else the only node; -1 unknown.
  int numa_of(int dev) const;
  int numa_index(int node_id) const;  // position in `numa`, -1 when absent
  // Upstream chain as the kernel walks it: dev, up(dev), up(up(dev)), ... up to the root bus.
  std::vector<int> chain(int dev) const;
  int nic_by_name(std::string_view name) const;
  // CUDA link between the GPUs at device indices a and b, nullptr when unknown.
  const CudaPeerLink* cuda_link(int dev_a, int dev_b) const;
  int cuda_ordinal(int dev) const;  // -1 when not a matched CUDA device
  int device_of_cuda(int ordinal) const;
  std::string label(int dev) const;  // "0000:03:00.0 gpu NVIDIA 2330"
};

// Reads the tree under `tree.root()`. Errors: kNotFound when the root does not exist,
// kInvalidArgument when it is not a sysfs tree (no devices/ directory).
Result<Topology> discover(const SysfsTree& tree);
Result<Topology> discover(const std::string& root);

// Matches CUDA devices to PCI devices by bus id and stores the overlay in the topology.
void apply_cuda_overlay(Topology& topo, CudaOverlay overlay);

// Queries the CUDA runtime (built with CUDA) or says why not. Never fails, never crashes.
CudaOverlay query_cuda_overlay();

// This machine, for the engine: discover(sysfs_root) plus the CUDA overlay when sysfs_root is the
// live "/sys" (a captured tree describes another machine, so no overlay is applied to it).
Result<std::shared_ptr<const Topology>> discover_local(const std::string& sysfs_root = "/sys");

}  // namespace dmx::topo
