#include "topo/pci.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>

namespace dmx::topo {

namespace {

bool parse_hex(std::string_view s, uint32_t* out) {
  if (s.empty()) return false;
  auto r = std::from_chars(s.data(), s.data() + s.size(), *out, 16);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

uint32_t le(std::string_view b, size_t off, size_t n) {
  uint32_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(b[off + i])) << (8 * i);
  return v;
}

}  // namespace

std::optional<PciAddress> PciAddress::parse(std::string_view text) {
  // DDDD:BB:DD.F
  if (text.size() != 12 || text[4] != ':' || text[7] != ':' || text[10] != '.') return std::nullopt;
  PciAddress a;
  if (!parse_hex(text.substr(0, 4), &a.domain) || !parse_hex(text.substr(5, 2), &a.bus) ||
      !parse_hex(text.substr(8, 2), &a.dev) || !parse_hex(text.substr(11, 1), &a.fn))
    return std::nullopt;
  if (a.dev > 31 || a.fn > 7) return std::nullopt;
  return a;
}

std::string PciAddress::to_string() const {
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", domain, bus, dev, fn);
}

std::string_view port_type_name(PortType t) {
  switch (t) {
    case PortType::kUnknown:
      return "unknown";
    case PortType::kNotPcie:
      return "pci";
    case PortType::kEndpoint:
      return "endpoint";
    case PortType::kLegacyEndpoint:
      return "legacy-endpoint";
    case PortType::kRootPort:
      return "root-port";
    case PortType::kSwitchUpstream:
      return "switch-upstream";
    case PortType::kSwitchDownstream:
      return "switch-downstream";
    case PortType::kPcieToPciBridge:
      return "pcie-to-pci-bridge";
    case PortType::kPciToPcieBridge:
      return "pci-to-pcie-bridge";
    case PortType::kRcEndpoint:
      return "rc-endpoint";
    case PortType::kRcEventCollector:
      return "rc-event-collector";
  }
  return "unknown";
}

std::string_view device_kind_name(DeviceKind k) {
  switch (k) {
    case DeviceKind::kOther:
      return "device";
    case DeviceKind::kHostBridge:
      return "host-bridge";
    case DeviceKind::kBridge:
      return "bridge";
    case DeviceKind::kGpu:
      return "gpu";
    case DeviceKind::kNic:
      return "nic";
    case DeviceKind::kNvme:
      return "nvme";
    case DeviceKind::kAccelerator:
      return "accelerator";
  }
  return "device";
}

ConfigInfo parse_config(std::string_view b) {
  ConfigInfo info;
  info.length = b.size();
  if (b.size() < 64) {
    info.problem = fmt::format("config space is {} bytes (a header needs 64)", b.size());
    return info;
  }
  info.ext_space_readable = b.size() >= 4096;
  uint16_t status = static_cast<uint16_t>(le(b, 0x06, 2));
  bool cap_list = (status & 0x0010) != 0;
  if (b.size() < 256) {
    // Only the header is visible (non-root reader): capabilities and port type are unknown.
    return info;
  }
  info.port_type = PortType::kNotPcie;
  if (cap_list) {
    uint32_t pos = le(b, 0x34, 1) & 0xfc;
    for (int guard = 0; pos >= 0x40 && pos + 2 <= 256 && guard < 48; ++guard) {
      uint32_t id = le(b, pos, 1);
      uint32_t next = le(b, pos + 1, 1) & 0xfc;
      if (id == 0x10 && pos + 0x14 <= 256) {  // PCI Express capability
        info.has_pcie_cap = true;
        uint32_t flags = le(b, pos + 2, 2);
        switch ((flags >> 4) & 0xf) {
          case 0x0:
            info.port_type = PortType::kEndpoint;
            break;
          case 0x1:
            info.port_type = PortType::kLegacyEndpoint;
            break;
          case 0x4:
            info.port_type = PortType::kRootPort;
            break;
          case 0x5:
            info.port_type = PortType::kSwitchUpstream;
            break;
          case 0x6:
            info.port_type = PortType::kSwitchDownstream;
            break;
          case 0x7:
            info.port_type = PortType::kPcieToPciBridge;
            break;
          case 0x8:
            info.port_type = PortType::kPciToPcieBridge;
            break;
          case 0x9:
            info.port_type = PortType::kRcEndpoint;
            break;
          case 0xa:
            info.port_type = PortType::kRcEventCollector;
            break;
          default:
            info.port_type = PortType::kUnknown;
            break;
        }
        uint32_t devctl = le(b, pos + 0x08, 2);
        info.max_payload = 128u << ((devctl >> 5) & 0x7);
        info.max_read_request = 128u << ((devctl >> 12) & 0x7);
        uint32_t lnkctl = le(b, pos + 0x10, 2);
        info.rcb = (lnkctl & 0x8) ? 128u : 64u;
      }
      if (next == pos) break;
      pos = next;
    }
  }
  if (!info.ext_space_readable) return info;
  uint32_t pos = 0x100;
  for (int guard = 0; pos >= 0x100 && pos + 8 <= 4096 && guard < 96; ++guard) {
    uint32_t header = le(b, pos, 4);
    if (header == 0 || header == 0xffffffff) break;
    uint32_t id = header & 0xffff;
    uint32_t next = (header >> 20) & 0xffc;
    if (id == 0x000d) {  // Access Control Services
      info.has_acs = true;
      info.acs_ctrl = static_cast<uint16_t>(le(b, pos + 6, 2));
    }
    if (next == 0 || next == pos) break;
    pos = next;
  }
  return info;
}

std::optional<bool> PciDevice::acs_redirects() const {
  if (!config_read) return std::nullopt;
  if (config.ext_space_readable) return config.has_acs && (config.acs_ctrl & kAcsRedirectMask) != 0;
  // A conventional PCI device has no extended space, hence no ACS capability.
  if (config.length >= 256 && !config.has_pcie_cap) return false;
  return std::nullopt;
}

double link_gts(std::string_view speed) {
  if (speed.empty()) return 0;
  std::string s(speed);
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || v <= 0 || v > 1000) return 0;
  return v;
}

double link_bytes_per_second(std::string_view speed, int width) {
  double gts = link_gts(speed);
  if (gts <= 0 || width <= 0) return 0;
  double encoding = gts <= 5.0 ? 8.0 / 10.0 : (gts < 64.0 ? 128.0 / 130.0 : 242.0 / 256.0);
  return gts * 1e9 * width * encoding / 8.0;
}

std::string vendor_name(uint16_t vendor) {
  switch (vendor) {
    case 0x10de:
      return "NVIDIA";
    case 0x1002:
      return "AMD";
    case 0x1022:
      return "AMD";
    case 0x8086:
      return "Intel";
    case 0x15b3:
      return "Mellanox";
    case 0x14e4:
      return "Broadcom";
    case 0x1000:
      return "Broadcom/LSI";
    case 0x10b5:
      return "PLX";
    case 0x1af4:
      return "virtio";
    case 0x1ae0:
      return "Google";
    case 0x1d0f:
      return "Amazon";
    case 0x144d:
      return "Samsung";
    case 0x1344:
      return "Micron";
    case 0x1dd8:
      return "AMD Pensando";
    case 0x1fc9:
      return "Tehuti";
    default:
      return fmt::format("{:04x}", vendor);
  }
}

}  // namespace dmx::topo
