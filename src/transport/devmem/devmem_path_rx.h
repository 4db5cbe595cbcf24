// The devmem path's receive side: io_uring zcrx or devmem RX, behind one interface.
//
// Which one (open_path_rx): setting devmem_rx = auto tries zcrx first where the seams offer it
// (production: Linux 6.16+, the NIC's queue API), one interface queue per path, registered on the
// first free queue of devmem_queues (EEXIST: the next) with a dma-buf of the path's own area; when
// that is refused it falls back to devmem RX (the process's pool binding on all of devmem_queues,
// rx_binding.h) and says why. devmem_rx = zcrx or devmem: that receiver only (a refusal fails the
// path with the reason). The chosen receiver's note is part of the path's describe().
//
// zcrx and devmem RX cannot share queues (each is a memory provider, one per queue): in auto mode
// the transport holds the devmem binding only when zcrx is not possible here (devmem_transport.cc).
#pragma once

#include <poll.h>

#include <memory>
#include <optional>
#include <string>

#include "core/config.h"
#include "transport/devmem/devmem.h"
#include "transport/devmem/devmem_path.h"

namespace dmx::devmem {

// Owned by the path's thread (created on another, first used there: see ZcrxKernel::wait).
class PathRx {
 public:
  virtual ~PathRx() = default;  // waits (bounded) for gathers and gives every buffer/token back
  // Gathers what has arrived into dst from *got on without blocking (devmem: recvmsg; zcrx: CQEs).
  virtual Status receive_some(MemRegion dst, size_t* got, Deadline device_deadline) = 0;
  // After *got reached dst.size: waits for the gathers, gives the buffers back.
  virtual Status finish(Deadline deadline) = 0;
  // Bytes taken off the socket that no receive claimed (zcrx holds them in its area; devmem leaves
  // them in the socket, where FIONREAD sees them: 0).
  virtual Result<uint64_t> unclaimed() = 0;
  // The peer sent more than it announced: consume and account for it (devmem: the tokens).
  virtual Status reject_unexpected() = 0;
  // What to poll for "more may have arrived": fd -1 means the data socket's POLLIN.
  virtual pollfd ready_fd() const = 0;
  virtual void counters(DevmemPathCounters* c) const = 0;
};

struct PathRxChoice {
  std::unique_ptr<PathRx> rx;
  std::optional<uint32_t> queue;  // zcrx: the one queue the data socket must be steered to
  std::string note;               // "zcrx: queue 13, ..." / "devmem RX: ...; zcrx not used: <why>"
};

// The receiver for the data socket `fd` (its KernelSocket `sock`), gathering with `gatherer`.
Result<PathRxChoice> open_path_rx(const HostSeams& seams, int fd, KernelSocket* sock, Gatherer* gatherer,
                                  const Config& config, const std::string& peer);

// The zcrx receiver alone (devmem_path_zcrx.cc): kUnavailable with the reason when not possible.
Result<PathRxChoice> open_zcrx_path_rx(const HostSeams& seams, int fd, Gatherer* gatherer, const Config& config,
                                       const std::string& peer);

}  // namespace dmx::devmem
