// Choosing and connecting an endpoint's transports at connection time (transport/transport.h),
// the same way for every transport.
//
// Offers: each side lists in its HELLO the transports it can use (name, descriptor), in its
// registry's order. A client offering one that needs a side channel also listens on a Unix socket
// and names it in HELLO. The server keeps, for its own HELLO, each transport that both offer and
// that compatible() accepts, connects the side channels of those that need one (dropping a
// transport whose channel cannot be reached), and asks admit(). Both sides then agree on exactly
// the transports the server's HELLO lists, in its order (agree()): a transport's position there,
// plus one, is its path id on the wire.
//
// Side channels are authenticated like a JOIN: the server's first message on each is the session
// id, a proof of the key and the transport's name. Data sockets are extra TCP connections after the
// stream JOINs: JOIN index streams + k for the k-th agreed transport that needs one (docs/wire.md).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "engine/context_impl.h"
#include "stream/conduit.h"
#include "transport/path.h"
#include "transport/side_channel.h"
#include "transport/transport.h"
#include "wire/handshake.h"

namespace dmx {

inline constexpr std::string_view kLocalLabel = "dmx1 local channel proof";

// The facts both sides derive from the two HELLOs.
PeerPair peer_pair(const wire::Hello& client, const wire::Hello& server);

// Before HELLO: the transports this side offers go into `hello->offers`. The client (`listener`
// not null) also listens for side channels when an offer needs them. `why_not` collects the
// reasons for transports not offered.
void offer_transports(const ContextImpl& ctx, wire::Hello* hello, std::optional<UnixListener>* listener,
                      std::string* why_not);

// The server's side channels, connected at HELLO, by transport name.
using SideChannels = std::vector<std::pair<std::string, UnixChannel>>;

// Server, at HELLO (after offer_transports on `server`): keeps in server->offers only what it
// accepts for this client, and connects the side channels. `why_not` gets the reasons.
void accept_transports(const ContextImpl& ctx, const wire::Hello& client, wire::Hello* server,
                       SideChannels* channels, std::string* why_not);

// Both sides: the agreed transports (the server's HELLO list, checked against this side's
// registry and compatible()); kProtocol when the server listed one this side cannot accept.
Result<TransportList> agree(const ContextImpl& ctx, const wire::Hello& client, const wire::Hello& server);

// How many of `agreed` need a data socket (JOIN indexes streams .. streams + n - 1).
size_t data_sockets_needed(const TransportList& agreed);

// What connect_transports makes: a path per agreed transport (null for those that make none;
// path id = index + 1), and the conduit for stream 0 (or null).
struct TransportLinks {
  std::vector<std::unique_ptr<PayloadPath>> paths;
  std::unique_ptr<stream::Conduit> control;
};

// Both sides, after the streams and data sockets have joined. The client accepts the side
// channels on `listener` (when one is needed) and checks the server's proofs; the server passes its `channels`.
Result<TransportLinks> connect_transports(const ContextImpl& ctx, const TransportList& agreed,
                                          const wire::Hello& client, const wire::Hello& server, bool is_client,
                                          std::optional<UnixListener> listener, SideChannels channels,
                                          std::vector<UniqueFd> data_sockets, const std::string& peer,
                                          Deadline deadline);

// The streams' conduits: a socket each, except that stream 0 runs on `control` when there is one
// (its socket is closed: it served the handshake only).
std::vector<std::unique_ptr<stream::Conduit>> stream_conduits(std::vector<UniqueFd> fds,
                                                              std::unique_ptr<stream::Conduit> control);

}  // namespace dmx
