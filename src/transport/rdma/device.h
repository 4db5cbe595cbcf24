// The verbs device the rdma transport uses: which device, port and GID (from the settings
// rdma_device, rdma_port, rdma_gid_index, or the first usable), opened once per context and shared
// by its endpoints' paths (each path allocates its own protection domain: an rkey one peer learnt
// is useless on another peer's queue pairs). Every refusal says exactly why: no device, port down,
// no usable GID, the verbs call and errno.
#pragma once

#include <infiniband/verbs.h>

#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "dmx/status.h"
#include "transport/rdma/wire.h"

namespace dmx::rdma {

struct PortChoice {
  std::string device;
  uint8_t port = 0;
  int gid_index = -1;
  Gid gid{};
  bool ethernet = false;  // RoCE; else InfiniBand (then the LID routes)
  uint16_t lid = 0;
  uint8_t mtu = 0;  // active MTU, enum ibv_mtu
  std::string gid_kind;  // "RoCE v2 IPv4", "RoCE v1", "IB"
};

// An open device. Thread-safe (verbs contexts are).
class Device {
 public:
  ~Device();
  ibv_context* context() const { return ctx_; }
  const PortChoice& choice() const { return choice_; }
  std::string describe() const;  // "rxe0 port 1 GID 3 (RoCE v2 IPv4 ::ffff:10.0.0.1) MTU 1024"

 private:
  friend Result<std::shared_ptr<Device>> open_device(const Config& config);
  ibv_context* ctx_ = nullptr;
  PortChoice choice_;
};

// Opens the device the settings name (or the first with an active port and a GID).
// kUnavailable with the reason.
Result<std::shared_ptr<Device>> open_device(const Config& config);

// One line per device and port for `dmx probe`: state, link layer, MTU, GIDs; `usable` is whether
// that port can carry a connection.
struct PortReport {
  std::string name;  // "rxe0:1"
  bool usable = false;
  std::string detail;
};
// Every device and port libibverbs sees, or the reason it sees none (an empty list never comes back
// without a reason in `why`).
std::vector<PortReport> survey_ports(std::string* why);

// The PCI function of a verbs device ("0000:3b:00.0") through sysfs (<root>/class/infiniband/<dev>/device),
// or "" when it is not a PCI device (rxe, siw).
std::string device_pci_address(const std::string& sysfs_root, const std::string& device);

const char* mtu_text(uint8_t mtu);

}  // namespace dmx::rdma
