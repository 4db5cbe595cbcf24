// Connecting an rdma path: its protection domain, completion queue (with a completion channel the
// progress thread sleeps on) and RC queue pairs, brought to RTS against the peer's. The queue-pair
// numbers, PSNs and GID travel only on the engine's authenticated data socket (Bootstrap): each
// side writes its ConnInfo, reads and validates the peer's, moves its queue pairs to RTR and RTS,
// and the two exchange one byte so that neither posts before the other's queue pairs receive.
// The socket stays with the path afterwards: its end is the prompt sign of a peer that died.
#pragma once

#include <infiniband/verbs.h>

#include <memory>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/sys.h"
#include "transport/rdma/device.h"
#include "transport/rdma/registration.h"
#include "transport/rdma/wire.h"

namespace dmx::rdma {

struct Depths {
  int qps = 4;       // queue pairs this side proposes (the smaller count of the two is used)
  int send = 128;    // work requests per send queue
  int recv = 128;    // receives posted per queue pair (release notices)
  uint64_t max_chunk = 8 << 20;
};

// What a connected path owns. Destroyed in order: queue pairs, CQ, channel, then the PD (which the
// Mrs made in it also hold).
class Connection {
 public:
  ~Connection();
  std::shared_ptr<Pd> pd;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  std::vector<ibv_qp*> qps;  // the agreed count, connected
  ConnInfo mine, theirs;
  int max_rd_atomic = 1;  // RDMA READs in flight per queue pair (both sides' limits)
  int cq_depth = 0;
  Depths depths;
  // Moves every queue pair to the error state (their outstanding work completes flushed).
  void to_error();
  // Destroys the queue pairs now (after to_error and the drain).
  void destroy_qps();
  // The index of the queue pair with this number, or -1.
  int index_of(uint32_t qpn) const;
};

// Posts `n` receives (no buffers: release notices carry only immediate data) with wr_id `index`.
Status post_receives(ibv_qp* q, int index, int n, const std::string& peer);

// Sets up and connects on `sock` (the data socket, blocking or not) before `deadline`.
// `hostile` is for tests only: it rewrites this side's ConnInfo before it is sent.
Result<std::unique_ptr<Connection>> connect_qps(const std::shared_ptr<Device>& dev, int sock, Depths depths, const std::string& peer,
                                                Deadline deadline, void (*hostile)(ConnInfo*) = nullptr);

}  // namespace dmx::rdma
