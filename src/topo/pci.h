// PCI devices as discovery sees them: addresses, identity, place in the tree, link, ACS.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dmx::topo {

struct PciAddress {
  uint32_t domain = 0;
  uint32_t bus = 0;
  uint32_t dev = 0;
  uint32_t fn = 0;

  // "0000:00:1f.3" (the sysfs spelling; case-insensitive hex). nullopt when not of that shape.
  static std::optional<PciAddress> parse(std::string_view text);
  std::string to_string() const;
  uint32_t devfn() const { return dev << 3 | fn; }
  auto operator<=>(const PciAddress&) const = default;
};

// PCI Express device/port type (PCIe capability, flags bits 7:4).
enum class PortType : uint8_t {
  kUnknown,  // config space unreadable and not inferable
  kNotPcie,  // conventional PCI device (no PCIe capability)
  kEndpoint,
  kLegacyEndpoint,
  kRootPort,
  kSwitchUpstream,
  kSwitchDownstream,
  kPcieToPciBridge,
  kPciToPcieBridge,
  kRcEndpoint,
  kRcEventCollector,
};
std::string_view port_type_name(PortType t);

enum class DeviceKind : uint8_t { kOther, kHostBridge, kBridge, kGpu, kNic, kNvme, kAccelerator };
std::string_view device_kind_name(DeviceKind k);

// What config space told us. Absent fields mean "could not tell" (short read: non-root users see
// only the first 64 bytes; conventional devices have no extended space).
struct ConfigInfo {
  size_t length = 0;
  bool has_pcie_cap = false;
  PortType port_type = PortType::kUnknown;
  std::optional<uint32_t> max_payload;       // bytes, from Device Control
  std::optional<uint32_t> max_read_request;  // bytes, from Device Control
  std::optional<uint32_t> rcb;               // read completion boundary, from Link Control (64/128)
  bool ext_space_readable = false;           // 4096 bytes were read
  bool has_acs = false;
  uint16_t acs_ctrl = 0;
  std::string problem;  // non-empty when the bytes were malformed
};
// Parses raw config-space bytes; never reads out of range, never loops forever.
ConfigInfo parse_config(std::string_view bytes);

// ACS control bits that make the kernel's P2PDMA rule route through the host bridge.
inline constexpr uint16_t kAcsRequestRedirect = 0x0004;
inline constexpr uint16_t kAcsCompletionRedirect = 0x0008;
inline constexpr uint16_t kAcsEgressControl = 0x0020;
inline constexpr uint16_t kAcsRedirectMask = kAcsRequestRedirect | kAcsCompletionRedirect | kAcsEgressControl;

struct LinkInfo {
  std::string cur_speed;  // "32.0 GT/s PCIe" as sysfs says; empty when unknown
  std::string max_speed;
  int cur_width = -1;
  int max_width = -1;
};
// GT/s from a sysfs speed string ("16.0 GT/s PCIe" -> 16.0); 0 when unknown.
double link_gts(std::string_view speed);
// Usable bytes per second of one direction (encoding overhead only), 0 when unknown.
double link_bytes_per_second(std::string_view speed, int width);

struct P2pmemInfo {
  bool present = false;  // the device has a p2pmem/ directory (a BAR set up for P2PDMA)
  uint64_t size = 0;
  uint64_t available = 0;
  bool published = false;
};

struct PciDevice {
  PciAddress addr;
  std::string path;         // directory relative to the sysfs root
  std::string host_bridge;  // "pci0000:00": the root bus this device hangs under
  int parent = -1;          // index of the bridge whose directory holds this one; -1 on a root bus
  int upstream = -1;        // pci_upstream_bridge(): the PF's parent for a VF; -1 on a root bus
  int physfn = -1;          // index of the PF for a virtual function
  bool ids_known = false;
  uint16_t vendor = 0;
  uint16_t device = 0;
  uint32_t class_code = 0;  // 24-bit class/subclass/prog-if
  DeviceKind kind = DeviceKind::kOther;
  PortType port_type = PortType::kUnknown;
  bool port_type_inferred = false;  // from the tree's shape, config space did not say
  ConfigInfo config;
  bool config_read = false;
  int numa_node = -1;  // as sysfs says; -1 unknown
  std::string local_cpulist;
  LinkInfo link;
  std::string driver;
  P2pmemInfo p2pmem;
  std::vector<std::string> problems;  // unreadable or garbage attributes, in words

  bool is_bridge() const { return kind == DeviceKind::kBridge; }
  // ACS redirect state for the P2PDMA rule: true/false, nullopt when config space did not say.
  std::optional<bool> acs_redirects() const;
};

// "NVIDIA", "Mellanox", ... for the vendors dmx cares about; hex otherwise.
std::string vendor_name(uint16_t vendor);

}  // namespace dmx::topo
