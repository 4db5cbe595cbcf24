// Choosing and building payload paths at connection time (see payload_path.h).
//
// devmem (peers on different hosts): each side offers it when transport is auto or devmem and
// devmem_offer() is ok; the server drops the bit for a same-host client unless it is itself forced
// to devmem. When agreed, the client opens one more TCP connection after the stream JOINs (JOIN
// index = streams: the data socket, docs/wire.md); build_paths makes the devmem path over it.
//
// Offers: each side sets in its HELLO the path bits it can use (shm: Unix sockets and memfd work;
// cuda_ipc: CUDA IPC works here). The client also listens on a Unix socket for the side channels
// (shm, control pipe, cuda_ipc's fd channel: engine/ipc_fds.h) and names it in HELLO. The server, seeing the same host,
// connects to that socket at once and keeps only the bits it accepts (shm: the channel connected; cuda_ipc: the peer is
// another process), so both sides then pick paths from the same two HELLOs. The side channel is
// authenticated like a JOIN: the server's first message is the session id, a proof of the key and
// the channel's purpose. The client, having accepted the channel, creates the shared region; the
// server maps it.
//
// Control pipe (same host, unless transport is tcp or devmem, or control_pipe=false): a second
// side channel carries a shared-memory pipe, and both sides run stream 0 — every control frame,
// every path chunk header, small inline payloads — over it instead of TCP (latency: a TCP
// loopback hop costs microseconds, the pipe a fraction of one). Its TCP socket then only served
// the handshake and is closed.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/clock.h"
#include "engine/context_impl.h"
#include "engine/payload_path.h"
#include "transport/tcp/conduit.h"
#include "transport/shm/shm.h"
#include "wire/handshake.h"

namespace dmx {

inline constexpr std::string_view kLocalLabel = "dmx1 local channel proof";

// Client: before HELLO. Sets the path bits this side offers and, for shm, listens on a Unix
// socket named in `hello->local_channel`. `why_not` collects the reasons for paths not offered.
void offer_paths(const ContextImpl& ctx, wire::Hello* hello, std::optional<shm::UnixListener>* listener,
                 std::string* why_not);

// Whether this side can offer devmem: a test factory installed on the context (then ok: "test
// double"), else devmem_path_offer(config) with its exact reason.
Status devmem_offer(const ContextImpl& ctx);

// The server's side channels, connected at HELLO.
struct LocalChannels {
  std::optional<shm::UnixChannel> shm, control, fds;  // fds: cuda_ipc's, for cuMem allocations
};

// Server: at HELLO. Clears the bits of `server` that it cannot accept for this client (different
// host, same process, side channel unreachable) and connects the side channels (shm, control
// pipe, cuda_ipc's fds), sending the session's proof on each. `why_not` gets the reasons.
void accept_paths(const ContextImpl& ctx, const wire::Hello& client, wire::Hello* server, LocalChannels* channels,
                  std::string* why_not);

// What build_paths makes: the payload paths, and the control pipe for stream 0 (or null).
struct LocalLinks {
  std::vector<std::unique_ptr<PayloadPath>> paths;
  std::unique_ptr<tcp::Conduit> control;
};

// Both sides, after the streams have joined: builds the agreed paths and control pipe. The client
// accepts the side channels on `listener` and checks the server's proofs; the server uses its
// connected `channels`.
// `data_socket`: the devmem data socket when devmem was agreed (the path takes it): the context's
// test factory makes the path, else make_devmem_path on CUDA device `devmem_gpu` (which adds the
// NIC flow rule for the connection).
Result<LocalLinks> build_paths(const ContextImpl& ctx, uint64_t agreed_bits, const wire::Hello& client,
                               const wire::Hello& server, std::optional<shm::UnixListener> listener,
                               LocalChannels channels, UniqueFd data_socket, const std::string& peer,
                               Deadline deadline);

// The streams' conduits: a socket each, except that stream 0 runs on `control` when there is one
// (its socket is closed: it served the handshake only).
std::vector<std::unique_ptr<tcp::Conduit>> stream_conduits(std::vector<UniqueFd> fds,
                                                           std::unique_ptr<tcp::Conduit> control);

}  // namespace dmx
