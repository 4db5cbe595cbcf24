// The rdma payload path (transport/path.h): chunks move by RDMA READ over several RC queue pairs.
//
//   sender:   post_tx registers the source chunk for remote read (or takes the registration of the
//             user's registered region that holds it: registration.h) and sends {addr, len, rkey,
//             token} as the chunk's descriptor.
//   receiver: post_rx validates the descriptor, and the progress thread READs the chunk into its
//             destination (registered the same way; memory the NIC cannot register, such as GPU
//             memory without dma-buf or peer memory, through a host staging buffer and the copy
//             engines), striped over the queue pairs in pieces; when
//             every piece has landed, on_path_rx_done, and a SEND with the token as immediate data
//             tells the sender it may let go.
//   sender:   that notice: the chunk's registration is dropped and on_path_tx_done follows (the
//             path is not receiver_releases(): the release travels on the queue pairs themselves).
//
// Why READ and not WRITE-with-immediate: the path interface hands the sender a source before the
// receiver's destination is known to the path (the engine matched it on stream 0); a READ needs no
// second round trip to learn where to write, and no registration ever grants a peer write access
// (docs/rdma.md).
//
// Errors: a completion with an error (the NIC refused an rkey or address, retries exhausted: the
// peer died) fails the path naming the peer, the queue pair and the verbs status; so does a release
// notice for a token not in flight, and the end of the data socket. At the end the queue pairs are
// moved to the error state and their flushed work drained (bounded) before the path lets go of user
// memory.
//
// Threading: PathBase. post_tx registers under the tx lock (a syscall for memory not registered
// with the context); post_rx only queues. Lock order: tx_mu_ -> the post lock.
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

struct PathSetup {
  std::shared_ptr<Device> device;
  std::shared_ptr<RegionTable> regions;  // may be null
  GpuRegistration gpu;
  std::unique_ptr<Connection> connection;
  UniqueFd socket;  // the data socket, watched for the peer's end
  std::string peer;
  const RxTamper* tamper = nullptr;  // tests only
};

std::unique_ptr<PayloadPath> make_rdma_path(PathSetup setup);

}  // namespace dmx::rdma
