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

// Scatter-gather entries a send work request may carry (within the device's max_sge): a list's
// WRITEs gather up to this many source pieces each.
inline constexpr int kMaxSendSge = 16;

struct Depths {
  int qps = 4;       // queue pairs this side proposes (the smaller count of the two is used)
  int send = 128;    // work requests per send queue
  int recv = 64;     // receive slots posted per queue pair (clear-to-sends, small chunks, WRITE notices)
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
  int send_sge = 1;       // scatter-gather entries per send work request (<= kMaxSendSge)
  int cq_depth = 0;
  Depths depths;
  // One registered pool of kSmallMax-byte slots: each queue pair's `depths.recv` receive slots,
  // then `send_slots` slots for SENDs with a payload (clear-to-sends, small chunks).
  std::unique_ptr<unsigned char[]> slots;
  std::shared_ptr<Mr> slots_mr;
  uint32_t send_slots = 0;
  unsigned char* recv_slot(int qp, uint32_t i) const {
    return slots.get() + (static_cast<size_t>(qp) * static_cast<size_t>(depths.recv) + i) * kSmallMax;
  }
  unsigned char* send_slot(uint32_t i) const { return recv_slot(static_cast<int>(qps_made), i); }
  size_t qps_made = 0;  // queue pairs created (the pool was sized for them)
  // Posts receive slot `i` of queue pair `qp` (wr_id: qp << 32 | i).
  Status post_slot(int qp, uint32_t i, const std::string& peer);
  // Moves every queue pair to the error state (their outstanding work completes flushed).
  void to_error();
  // Destroys the queue pairs now (after to_error and the drain).
  void destroy_qps();
  // The index of the queue pair with this number, or -1.
  int index_of(uint32_t qpn) const;
};

// Sets up and connects on `sock` (the data socket, blocking or not) before `deadline`.
// `hostile` is for tests only: it rewrites this side's ConnInfo before it is sent.
Result<std::unique_ptr<Connection>> connect_qps(const std::shared_ptr<Device>& dev, int sock, Depths depths, const std::string& peer,
                                                Deadline deadline, void (*hostile)(ConnInfo*) = nullptr);

}  // namespace dmx::rdma
