// Stream 0 of an endpoint over one RC queue pair (the rdma_ctl transport): the stream's bytes
// (control frames, chunk headers, small inline payloads, ACKs) go by SEND into the peer's posted
// receive slots (kSmallMax bytes each), in order, with credits. The receiver grants
// `ConnInfo::credits` slots and gives them back as the stream reads them: in the immediate data of
// its next SEND, or in a SEND of its own once half are owed.
//
// Threading: the stream's worker calls everything but shutdown() (stream::Conduit). It polls the
// completion queue itself, so a message needs no hand-off to another thread; it sleeps on the
// completion channel and the data socket.
//
// The end: shutdown() (any thread) SENDs an end mark behind every byte sent; the peer reads them
// all, then kPeerFailed. The destructor waits (bounded) for its SENDs to be acknowledged before it
// lets the queue pair go. A peer that dies: its data socket closes, or a SEND's retries run out.
//
// Hostile peers: more SENDs than the credits granted, credits given back that were never lent, a
// credit message that gives back none, an empty or unknown message, a WRITE on the queue pair, a
// byte on the data socket: kProtocol naming the peer; the stream fails (its endpoint with it),
// other endpoints go on.
#pragma once

#include <memory>
#include <string>

#include "core/sys.h"
#include "stream/conduit.h"
#include "transport/rdma/setup.h"

namespace dmx::rdma {

// The depths the conduit's Connection is made with (connect_qps): one queue pair.
Depths control_depths();

std::unique_ptr<stream::Conduit> make_control_conduit(std::unique_ptr<Connection> conn, UniqueFd socket,
                                                      std::string peer);

}  // namespace dmx::rdma
