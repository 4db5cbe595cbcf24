// Distances between PCI devices, two views.
//
// 1. The Linux kernel's P2PDMA rule (drivers/pci/p2pdma.c, calc_map_type_and_dist and
//    pci_p2pdma_distance_many), reimplemented over sysfs with the same semantics: walk the
//    provider's upstream bridges; for each, walk the client's; the first common one gives
//    distance = hops on both sides. ACS redirect bits (RR, CR, EC) on the provider side up to and
//    including the common bridge, or on the client side below it, force the traffic through the
//    host bridge. Through-host-bridge traffic is allowed only on AMD Zen and later CPUs or when the
//    host bridge's first device is whitelisted; otherwise the map type is NOT_SUPPORTED.
// 2. The path class GPU communication libraries use: LOC, NVL, PIX, PXB, PHB, SYS.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "topo/topology.h"

namespace dmx::topo {

enum class MapType : uint8_t { kUnknown, kNotSupported, kBusAddr, kThruHostBridge };
std::string_view map_type_name(MapType m);  // "BUS_ADDR", "THRU_HOST_BRIDGE", "NOT_SUPPORTED", "UNKNOWN"

struct P2pdmaResult {
  MapType map = MapType::kUnknown;
  int distance = -1;
  int common = -1;               // the common upstream device, -1 when only the host bridge is shared
  std::vector<int> acs_devices;  // devices on the path whose ACS redirect bits are set
  std::vector<int> acs_unknown;  // devices on the path whose ACS state could not be read
  std::string reason;            // in words, including whitelist and CPU facts
};

// The kernel's calc_map_type_and_dist(provider, client). Devices whose ACS state is unknown
// (config space unreadable, e.g. not root) count as not redirecting; they are listed and named in
// the reason. kUnknown only for invalid indices.
P2pdmaResult p2pdma_distance(const Topology& topo, int provider, int client);

struct DistanceMany {
  int total = -1;  // -1 when any client is NOT_SUPPORTED (as the kernel returns)
  std::vector<P2pdmaResult> per_client;
};
DistanceMany p2pdma_distance_many(const Topology& topo, int provider, std::span<const int> clients);

// cpu_supports_p2pdma(): x86 AMD, family 0x17 (Zen) or later.
bool cpu_supports_p2pdma(const CpuInfo& cpu);
// __host_bridge_whitelist() for one host bridge; `why` says which entry matched or why none did.
bool host_bridge_whitelisted(const Topology& topo, const HostBridge& hb, bool same_host_bridge, std::string* why);

enum class PathClass : uint8_t { kLoc, kNvl, kPix, kPxb, kPhb, kSys, kUnknown };
std::string_view path_class_name(PathClass c);

struct PathInfo {
  PathClass cls = PathClass::kUnknown;
  int switches = 0;  // PCIe switches traversed below the root complex
  std::string why;
};

// LOC: the same device. NVL: GPUs joined by NVLink in the CUDA overlay. PIX: through at most one
// PCIe switch. PXB: through several switches, not through the root complex. PHB: through a root
// port / host bridge of one NUMA node. SYS: across NUMA nodes.
PathInfo path_class(const Topology& topo, int a, int b);

}  // namespace dmx::topo
