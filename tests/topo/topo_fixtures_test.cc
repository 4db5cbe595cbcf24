// Expected distances and map types for each fixture, worked out by hand from the kernel's rule:
// walk the provider's chain (itself first); for each node, walk the client's chain; the first
// match gives dist = hops(provider side) + hops(client side). ACS RR/CR/EC on provider-side nodes
// up to and including the common one, or client-side nodes below it, go through the host bridge.
// No common node: dist = len(provider chain) + len(client chain), through the host bridge.
// Through the host bridge: allowed for AMD family >= 0x17, else whitelist of the first device on
// the root bus, else NOT_SUPPORTED.
#include <gtest/gtest.h>

#include "topo/distance.h"
#include "topo/topo_fixture.h"

namespace dmx::topo {
namespace {

using testing::dev;
using testing::load;

void expect_p2p(const Topology& t, const char* a, const char* b, int dist, MapType map) {
  P2pdmaResult r = p2pdma_distance(t, dev(t, a), dev(t, b));
  EXPECT_EQ(r.distance, dist) << a << " -> " << b << ": " << r.reason;
  EXPECT_EQ(r.map, map) << a << " -> " << b << ": " << map_type_name(r.map) << " " << r.reason;
  P2pdmaResult back = p2pdma_distance(t, dev(t, b), dev(t, a));  // the rule is symmetric
  EXPECT_EQ(back.distance, dist) << b << " -> " << a;
  EXPECT_EQ(back.map, map) << b << " -> " << a << ": " << back.reason;
}

void expect_class(const Topology& t, const char* a, const char* b, PathClass c) {
  PathInfo p = path_class(t, dev(t, a), dev(t, b));
  EXPECT_EQ(p.cls, c) << a << " <-> " << b << ": " << path_class_name(p.cls) << " " << p.why;
}

TEST(TopoFixtures, GpuVmFlatVirtualPci) {
  Topology t = load("gpu-vm");
  ASSERT_EQ(t.devices.size(), 6u);
  ASSERT_EQ(t.gpus.size(), 2u);
  EXPECT_EQ(t.cpu.vendor, "Intel");
  EXPECT_EQ(t.cpu.family, 6);
  ASSERT_EQ(t.host_bridges.size(), 1u);
  EXPECT_EQ(t.host_bridges[0].root_device, dev(t, "0000:00:00.0"));
  int eth0 = t.nic_by_name("eth0");
  ASSERT_GE(eth0, 0);
  EXPECT_EQ(t.nics[eth0].pci, dev(t, "0000:00:03.0"));  // through virtio2/net/eth0
  EXPECT_EQ(t.nics[t.nic_by_name("lo")].pci, -1);
  EXPECT_EQ(t.devices[dev(t, "0000:00:06.0")].link.max_width, 16);
  EXPECT_EQ(link_gts(t.devices[dev(t, "0000:00:06.0")].link.max_speed), 32.0);
  // Root-bus devices: chains of one; no common bridge: 1 + 1 through the host bridge, which is
  // 8086:0d57 (not whitelisted) on an Intel CPU.
  expect_p2p(t, "0000:00:06.0", "0000:00:07.0", 2, MapType::kNotSupported);
  expect_p2p(t, "0000:00:06.0", "0000:00:03.0", 2, MapType::kNotSupported);
  expect_p2p(t, "0000:00:06.0", "0000:00:06.0", 0, MapType::kBusAddr);
  P2pdmaResult r = p2pdma_distance(t, dev(t, "0000:00:06.0"), dev(t, "0000:00:07.0"));
  EXPECT_NE(r.reason.find("0d57"), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find("not in the P2PDMA whitelist"), std::string::npos) << r.reason;
  expect_class(t, "0000:00:06.0", "0000:00:07.0", PathClass::kPhb);
  expect_class(t, "0000:00:06.0", "0000:00:06.0", PathClass::kLoc);
  // With the CUDA overlay the machine really has (NV18: access and native atomics) -> NVL.
  CudaOverlay o;
  o.available = true;
  o.devices = {{0, "NVIDIA H200", "0000:00:06.0", 141ull << 30, 9, 0, -1},
               {1, "NVIDIA H200", "0000:00:07.0", 141ull << 30, 9, 0, -1}};
  o.links = {{0, 1, true, true, 0}, {1, 0, true, true, 0}};
  apply_cuda_overlay(t, o);
  EXPECT_EQ(t.cuda_ordinal(dev(t, "0000:00:07.0")), 1);
  expect_class(t, "0000:00:06.0", "0000:00:07.0", PathClass::kNvl);
  expect_class(t, "0000:00:06.0", "0000:00:03.0", PathClass::kPhb);  // NVLink does not reach the NIC
  EXPECT_EQ(t.numa_of(dev(t, "0000:00:06.0")), 0);                   // numa_node -1, one node
}

TEST(TopoFixtures, DualSocketIcelake) {
  Topology t = load("dual-socket-icelake");
  ASSERT_EQ(t.gpus.size(), 2u);
  ASSERT_EQ(t.host_bridges.size(), 2u);
  EXPECT_EQ(t.devices[dev(t, "0000:01:00.0")].port_type, PortType::kSwitchUpstream);
  EXPECT_EQ(t.devices[dev(t, "0000:02:00.0")].port_type, PortType::kSwitchDownstream);
  EXPECT_EQ(t.devices[dev(t, "0000:00:01.0")].port_type, PortType::kRootPort);
  EXPECT_EQ(t.devices[dev(t, "0000:82:00.0")].acs_redirects(), std::optional<bool>(true));
  EXPECT_EQ(t.devices[dev(t, "0000:82:01.0")].acs_redirects(), std::optional<bool>(false));
  EXPECT_EQ(t.nics[t.nic_by_name("ens1")].rdma, std::vector<std::string>{"mlx5_0"});
  // GPU 03:00.0 [03, 02:00.0, 01:00.0, 00:01.0]; NIC 04:00.0 [04, 02:01.0, 01:00.0, 00:01.0]:
  // common 01:00.0 at 2 + 2 hops, no ACS: BUS_ADDR 4, one switch: PIX.
  expect_p2p(t, "0000:03:00.0", "0000:04:00.0", 4, MapType::kBusAddr);
  EXPECT_EQ(p2pdma_distance(t, dev(t, "0000:03:00.0"), dev(t, "0000:04:00.0")).common, dev(t, "0000:01:00.0"));
  expect_class(t, "0000:03:00.0", "0000:04:00.0", PathClass::kPix);
  // Socket 1: same shape, but 82:00.0 (GPU side) has ACS RR|CR: through the host bridge, whose
  // first device 80:00.0 is 8086:09a2 (whitelisted): THRU_HOST_BRIDGE, distance still 4.
  expect_p2p(t, "0000:83:00.0", "0000:84:00.0", 4, MapType::kThruHostBridge);
  P2pdmaResult acs = p2pdma_distance(t, dev(t, "0000:83:00.0"), dev(t, "0000:84:00.0"));
  ASSERT_EQ(acs.acs_devices.size(), 1u);
  EXPECT_EQ(acs.acs_devices[0], dev(t, "0000:82:00.0"));
  EXPECT_NE(acs.reason.find("disable_acs_redir=0000:82:00.0"), std::string::npos) << acs.reason;
  // Across sockets: no common node, chains of 4 and 4; both host bridges 09a2 (unrestricted).
  expect_p2p(t, "0000:03:00.0", "0000:83:00.0", 8, MapType::kThruHostBridge);
  expect_p2p(t, "0000:03:00.0", "0000:84:00.0", 8, MapType::kThruHostBridge);
  expect_class(t, "0000:03:00.0", "0000:83:00.0", PathClass::kSys);
  // NVMe 05:00.0 [05, 00:02.0] vs GPU chain of 4: 2 + 4 = 6 through host bridge pci0000:00.
  expect_p2p(t, "0000:05:00.0", "0000:03:00.0", 6, MapType::kThruHostBridge);
  expect_class(t, "0000:05:00.0", "0000:03:00.0", PathClass::kPhb);
  // pci_p2pdma_distance_many from the NVMe to {GPU, NIC}: 6 + 6.
  int clients[] = {dev(t, "0000:03:00.0"), dev(t, "0000:04:00.0")};
  EXPECT_EQ(p2pdma_distance_many(t, dev(t, "0000:05:00.0"), clients).total, 12);
  EXPECT_TRUE(t.devices[dev(t, "0000:05:00.0")].p2pmem.published);
  EXPECT_EQ(t.devices[dev(t, "0000:05:00.0")].p2pmem.size, 16u << 20);
  EXPECT_EQ(t.numa_of(dev(t, "0000:83:00.0")), 1);
}

TEST(TopoFixtures, DualSocketHaswellSameHostBridgeOnly) {
  Topology t = load("dual-socket-haswell");
  // GPU 02:00.0 [02, 00:02.0], NIC 03:00.0 [03, 00:03.0]: no common bridge, 2 + 2; one host
  // bridge 8086:2f00 (whitelisted when both sides share it). The EC bit on root port 00:02.0
  // changes nothing: the path goes through the host bridge anyway.
  expect_p2p(t, "0000:02:00.0", "0000:03:00.0", 4, MapType::kThruHostBridge);
  expect_class(t, "0000:02:00.0", "0000:03:00.0", PathClass::kPhb);
  // Across sockets: 2f00 is REQ_SAME_HOST_BRIDGE: NOT_SUPPORTED.
  expect_p2p(t, "0000:02:00.0", "0000:81:00.0", 4, MapType::kNotSupported);
  expect_p2p(t, "0000:81:00.0", "0000:03:00.0", 4, MapType::kNotSupported);
  expect_class(t, "0000:02:00.0", "0000:81:00.0", PathClass::kSys);
  int clients[] = {dev(t, "0000:03:00.0"), dev(t, "0000:81:00.0")};
  EXPECT_EQ(p2pdma_distance_many(t, dev(t, "0000:02:00.0"), clients).total, -1);
}

TEST(TopoFixtures, SwitchCascadeAmdWithVf) {
  Topology t = load("switch-cascade-amd");
  EXPECT_EQ(t.cpu.vendor, "AMD");
  EXPECT_EQ(t.cpu.family, 0x19);
  EXPECT_TRUE(cpu_supports_p2pdma(t.cpu));
  int vf = dev(t, "0000:07:00.2"), pf = dev(t, "0000:07:00.0");
  EXPECT_EQ(t.devices[vf].physfn, pf);
  EXPECT_EQ(t.devices[vf].upstream, dev(t, "0000:02:01.0"));
  // GPU A 05 [05, 04:00.0, 03:00.0, 02:00.0, 01:00.0, 00:01.1]; GPU B 06 [06, 04:01.0(EC), 03:00.0, ...]:
  // common 03:00.0 at 2 + 2; EC on 04:01.0 redirects; AMD Zen: THRU_HOST_BRIDGE 4.
  expect_p2p(t, "0000:05:00.0", "0000:06:00.0", 4, MapType::kThruHostBridge);
  expect_class(t, "0000:05:00.0", "0000:06:00.0", PathClass::kPix);
  // GPU A to the NIC PF [07, 02:01.0, 01:00.0, 00:01.1]: common 01:00.0 at 4 + 2; 02:01.0 has only
  // SV|TB|UF (ignored): BUS_ADDR 6; two switches: PXB. The VF walks from its PF: the same.
  expect_p2p(t, "0000:05:00.0", "0000:07:00.0", 6, MapType::kBusAddr);
  expect_p2p(t, "0000:05:00.0", "0000:07:00.2", 6, MapType::kBusAddr);
  expect_class(t, "0000:05:00.0", "0000:07:00.0", PathClass::kPxb);
  // PF and VF: common 02:01.0 at 1 + 1: "two functions of the same device: 2".
  expect_p2p(t, "0000:07:00.0", "0000:07:00.2", 2, MapType::kBusAddr);
  // GPU B to the NIC crosses 04:01.0 (EC): THRU_HOST_BRIDGE 6.
  expect_p2p(t, "0000:06:00.0", "0000:07:00.0", 6, MapType::kThruHostBridge);
  // The same tree on an Intel CPU: host bridge 1022:14a4 is not whitelisted.
  t.cpu.vendor = "Intel";
  t.cpu.family = 6;
  expect_p2p(t, "0000:05:00.0", "0000:06:00.0", 4, MapType::kNotSupported);
  expect_p2p(t, "0000:05:00.0", "0000:07:00.0", 6, MapType::kBusAddr);
}

TEST(TopoFixtures, CapturedCpuVm) {
  Topology t = load("this-cpu-vm");
  ASSERT_EQ(t.devices.size(), 6u);
  EXPECT_TRUE(t.gpus.empty());
  EXPECT_EQ(t.cpu.vendor, "AMD");
  EXPECT_EQ(t.cpu.family, 0x1a);
  int eth0 = t.nic_by_name("eth0");
  ASSERT_GE(eth0, 0);
  EXPECT_EQ(t.nics[eth0].pci, dev(t, "0000:00:03.0"));
  EXPECT_EQ(t.nics[eth0].driver, "virtio-pci");
  // virtio devices are conventional PCI (256-byte config, no PCIe capability): no ACS.
  EXPECT_EQ(t.devices[dev(t, "0000:00:03.0")].acs_redirects(), std::optional<bool>(false));
  EXPECT_EQ(t.devices[dev(t, "0000:00:03.0")].port_type, PortType::kNotPcie);
  // Root-bus devices, AMD family 0x1a: through the host bridge, allowed.
  expect_p2p(t, "0000:00:02.0", "0000:00:03.0", 2, MapType::kThruHostBridge);
  ASSERT_EQ(t.numa.size(), 1u);
  EXPECT_EQ(t.numa_of(dev(t, "0000:00:03.0")), 0);
}

// Captured on the GPU machine itself (nvidia-h200-x2, 2026-11-22, `dmx topo --capture`): the
// hand-made gpu-vm above must agree with reality. 8 devices: host bridge, 4 virtio (2 more than
// the hand-made tree), the NIC, and the two H200s on the root bus.
TEST(TopoFixtures, GpuMachineCapturedMatchesTheHandWorkedRule) {
  Topology t = load("gpu-h200x2");
  ASSERT_EQ(t.gpus.size(), 2u);
  EXPECT_EQ(t.cpu.vendor, "Intel");
  ASSERT_EQ(t.host_bridges.size(), 1u);
  ASSERT_GE(t.nic_by_name("eth0"), 0);
  EXPECT_EQ(t.nics[t.nic_by_name("eth0")].pci, dev(t, "0000:00:03.0"));
  // Same hand-worked answers as gpu-vm: root-bus chains of one, through the non-whitelisted
  // host bridge 8086:0d57: NOT_SUPPORTED at distance 1 + 1.
  expect_p2p(t, "0000:00:06.0", "0000:00:07.0", 2, MapType::kNotSupported);
  expect_p2p(t, "0000:00:06.0", "0000:00:03.0", 2, MapType::kNotSupported);
  expect_p2p(t, "0000:00:07.0", "0000:00:03.0", 2, MapType::kNotSupported);
  expect_class(t, "0000:00:06.0", "0000:00:07.0", PathClass::kPhb);  // PCIe view; NVLink comes from CUDA
}

TEST(TopoFixtures, EveryPairIsSymmetricAndNeverUnknown) {
  for (const char* name :
       {"gpu-vm", "gpu-h200x2", "dual-socket-icelake", "dual-socket-haswell", "switch-cascade-amd", "this-cpu-vm"}) {
    Topology t = load(name);
    for (size_t a = 0; a < t.devices.size(); ++a)
      for (size_t b = 0; b < t.devices.size(); ++b) {
        P2pdmaResult x = p2pdma_distance(t, int(a), int(b)), y = p2pdma_distance(t, int(b), int(a));
        ASSERT_NE(x.map, MapType::kUnknown) << name;
        EXPECT_EQ(x.distance, y.distance) << name << " " << a << " " << b;
        EXPECT_EQ(x.map, y.map) << name << " " << a << " " << b;
        EXPECT_EQ(path_class(t, int(a), int(b)).cls, path_class(t, int(b), int(a)).cls) << name;
      }
  }
}

}  // namespace
}  // namespace dmx::topo
