// devices.h — the NICs the plugin offers NCCL as devices.
//
// An interface qualifies when it is up and running and has an IPv4 address (IPv6 when it has
// none); the selection follows DMX_NCCL_IFNAME, else NCCL_SOCKET_IFNAME (comma-separated name
// prefixes; "^" first excludes them, "=" first makes them exact names), else every interface but
// lo, docker* and virbr*. With none, loopback is the one device (a single host only), and `note`
// says so. Speed and PCI path come from /sys/class/net/<name>.
#pragma once

#include <string>
#include <vector>

namespace dmx::nccl {

inline constexpr int kMaxDevices = 16;
inline constexpr int kDefaultSpeedMbps = 10000;  // when sysfs has no speed (virtual NICs), as NCCL's socket transport

struct Nic {
  std::string name;      // "eth0"
  std::string host;      // "10.0.0.1" or "[fe80::1%eth0]": as it goes into a dmx address
  std::string pci_path;  // "/sys/devices/pci0000:00/0000:00:03.0"; empty: virtual NIC
  int speed_mbps = kDefaultSpeedMbps;
  bool speed_known = false;
};

// Which interface names the filter selects: exposed for the tests.
bool interface_selected(const std::string& name, const std::string& filter);

std::vector<Nic> discover_nics(std::string* note);

}  // namespace dmx::nccl
