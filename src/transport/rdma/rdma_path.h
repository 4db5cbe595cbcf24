// The rdma payload path (transport/path.h): chunks move over several RC queue pairs, by RDMA
// WRITE with immediate data (large) or by SEND into the receiver's posted slots (small).
//
//   large:  post_tx registers the source for local access only and sends {len, token} as the
//           chunk's descriptor. The receiver's post_rx registers exactly the destination (or a
//           host staging buffer for memory the NIC cannot reach) for remote write and SENDs a
//           clear-to-send {addr, rkey} with the token as immediate data. The sender WRITEs the chunk
//           there, striped over the queue pairs, each stripe's (last) WRITE with the token as
//           immediate data: the receiver's landed notification. The sender's WRITE completions free
//           its source; the receiver's last stripe deregisters the window (its rkey dies) and
//           completes the chunk.
//   small:  (host memory, <= kSmallMax) the sender copies the bytes into a send slot and SENDs them
//           into one of the receiver's posted receive slots; the source is free at the copy. The
//           receiver holds the slot until the chunk's header meets it (either comes first), copies
//           it out, reposts the slot and answers kMsgDone, which returns the credit. Each side
//           grants the other `credits` small chunks in flight per queue pair (ConnInfo): a sender
//           out of credits waits (backpressure); a peer that sends past them is refused by name.
//   lists:  (post_tx_list: up to kRdmaMaxList pieces within the chunk maximum, a KV cache's blocks)
//           one large chunk whose descriptor is a single chunk's: the sender's WRITEs gather the
//           pieces (send_sge a work request, chained into one post) into the receiver's window,
//           which is always a staging buffer of the list's total length: the peer is granted
//           nothing of the destinations (a window for each of a thousand scattered blocks would
//           cost a registration each), and the receiver scatters the bytes once the last stripe
//           landed and the window is gone. A fresh staging buffer is zeroed (a peer that sends
//           every immediate but not every byte scatters zeros, not our heap); the staging held at
//           once is bounded (kMaxStaged), later chunks waiting their turn in order.
//
// No registration ever grants a peer more than one chunk's window, for that chunk's life; a window
// inside a region the user registered dies with the region (registration.h).
//
// Errors: a completion with an error (the NIC refused an rkey or address, retries exhausted: the
// peer died) fails the path naming the peer, the queue pair and the verbs status; so do a
// message for a token not in flight, small chunks past the credits, and the end of the data
// socket. At the end the queue pairs are moved to the error state and their flushed work drained
// (bounded) before the path lets go of user memory.
//
// Threading: PathBase. post_tx registers a large source under no lock (a syscall for memory not
// registered with the context); post_rx only queues. Lock order: tx_mu_ -> the post lock.
#pragma once

#include <memory>
#include <string>

#include "core/config.h"
#include "core/sys.h"
#include "transport/path.h"
#include "transport/rdma/device.h"
#include "transport/rdma/registration.h"
#include "transport/rdma/setup.h"
#include "transport/rdma/wire.h"

namespace dmx::rdma {

// The most pieces of a list chunk (PayloadPath::max_list): the wire's most.
inline constexpr size_t kRdmaMaxList = 1024;

struct PathSetup {
  std::shared_ptr<Device> device;
  std::shared_ptr<RegionTable> regions;  // may be null
  GpuRegistration gpu;
  std::unique_ptr<Connection> connection;
  UniqueFd socket;  // the data socket, watched for the peer's end
  std::string peer;
  const WriteTamper* tamper = nullptr;  // tests only
};

std::unique_ptr<PayloadPath> make_rdma_path(PathSetup setup);

}  // namespace dmx::rdma
