// The rdma transports: payload by RDMA WRITE with immediate and SEND over RC queue pairs of a
// verbs device (rdma_path.h), between hosts (on one host only when forced: shm and cuda_ipc come
// first). Built only with libibverbs (DMX_ENABLE_RDMA); without it the same factory makes a
// transport that says why not.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/capability.h"
#include "core/config.h"
#include "transport/transport.h"

namespace dmx {

namespace rdma {
struct ConnInfo;
struct WriteTamper;
}  // namespace rdma

// Tests only: hostile behaviour of this side.
struct RdmaTestHooks {
  void (*conn_info)(rdma::ConnInfo*) = nullptr;  // rewrites this side's queue-pair info before it goes
  const rdma::WriteTamper* tamper = nullptr;     // writes other than the clear-to-send says
};

std::shared_ptr<Transport> make_rdma_transport(RdmaTestHooks hooks = {});
// rdma_ctl: stream 0 by SENDs over an RC queue pair of the same device, agreed where rdma is
// (Gives::kControl; control_pipe turns it off).
std::shared_ptr<Transport> make_rdma_ctl_transport();

// Whether this process could use rdma under `config` (built with it, a device with an active port
// and a GID), or kUnavailable with the reason.
Status rdma_available(const Config& config);

// `dmx probe`'s rdma lines: each device and port, GPU memory registration (dma-buf, peer memory),
// and the PCIe distance between each GPU and the NIC (the advisor's verdict).
std::vector<Capability> probe_rdma(const std::string& sysfs_root, bool cuda);

}  // namespace dmx
