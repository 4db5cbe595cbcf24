// Connection set-up: the client's blocking handshake and the pieces both sides share.
//
// Exchange (see docs/wire.md): stream 0: C→S HELLO, S→C HELLO (with the server's proof of the
// key), C→S AUTH (the client's proof), S→C WELCOME; each extra stream i: C→S JOIN (session, i,
// proof), S→C WELCOME. Any refusal is a REJECT with the reason, then close.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/clock.h"
#include "engine/context_impl.h"
#include "engine/endpoint/endpoint_impl.h"
#include "wire/frame.h"
#include "wire/handshake.h"

namespace dmx {

inline constexpr std::string_view kServerLabel = "dmx1 server proof";
inline constexpr std::string_view kClientLabel = "dmx1 client proof";
inline constexpr std::string_view kJoinLabel = "dmx1 join proof";
inline constexpr std::string_view kRejoinLabel = "dmx1 rejoin proof";

// A REJOIN's proof: the session's nonces, its id and round (`first`), and the stream's index.
wire::Proof rejoin_proof(const AuthKey& key, const Session& s, uint16_t first, uint16_t index);

wire::Hello make_hello(const ContextImpl& ctx, wire::Role role);
// Chooses the data paths and fills the agreed session; the same rule on both sides, from the two
// HELLOs (the server has already dropped the bits it cannot accept). `why_not`: this side's
// reasons for paths not offered or not accepted, quoted in the session's reason.
Result<Session> negotiate(const ContextImpl& ctx, const wire::Hello& client, const wire::Hello& server,
                          const std::string& peer, const std::string& why_not);
// How often to send keepalives: our own interval, or more often when the peer gives up sooner.
std::chrono::microseconds keepalive_for(const EngineParams& mine, const wire::Hello& theirs);
// Notes the peer's store name and epoch from its HELLO in the session (docs/cluster.md).
void note_peer_identity(const ContextImpl& ctx, const wire::Hello& theirs, Session* s);
// Whether the peer's authentication mode works with ours; the reason when not, naming what the
// client and the server each run, so that it reads right on both sides (the server sends it).
Status check_auth_modes(const AuthKey& mine, wire::AuthMode theirs, wire::Role my_role);
// What a REJECT tells the peer: every REJECT answers a connection that has not authenticated, so it
// says what the client needs (its own frames were malformed, the keys or auth modes differ, a
// limit was hit) and never this side's environment (drivers, devices, settings' values), which
// only this side's log gives. Same code as `why`.
Status told_to_peer(const Status& why);

struct Frame {
  wire::FrameHeader header;
  std::vector<unsigned char> payload;
};
Status send_frame(int fd, wire::FrameType type, const std::vector<unsigned char>& payload, Deadline deadline,
                  const std::string& peer, uint64_t a0 = 0);
Result<Frame> recv_frame(int fd, Deadline deadline, const std::string& peer);

// The client side: connects and authenticates every stream. Each attempt has handshake_timeout
// (the same bound the listener gives an accepted connection); transient failures are retried with
// backoff until connect_timeout; a REJECT or an authentication failure returns at once, and so does
// a refused connection (nobody listens) unless connect_retry_refused asks to wait for a listener.
// Reconnect (endpoint/reconnect.cc): one new stream of the live session `s` to `address`
// ("host:port"): connects, sends REJOIN (stream `index` of the round from `first`) and waits for
// WELCOME, within `deadline`.
struct RejoinOutcome {
  bool refused = false;   // nobody listens there
  bool sent = false;      // the REJOIN went out (no answer: the peer may have taken the stream)
  bool rejected = false;  // the peer's REJECT: final
};
Result<UniqueFd> rejoin_stream(const ContextImpl& ctx, const Session& s, const std::string& address, uint16_t first,
                               uint16_t index, Deadline deadline, RejoinOutcome* out);

Result<std::shared_ptr<EndpointImpl>> connect_endpoint(const std::shared_ptr<ContextImpl>& ctx,
                                                       const std::string& address);

}  // namespace dmx
