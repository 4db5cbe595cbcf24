// Choosing and building payload paths at connection time (see payload_path.h).
//
// devmem (peers on different hosts): each side offers it when transport is auto or devmem and
// devmem_offer() is ok; the server drops the bit for a same-host client unless it is itself forced
// to devmem. When agreed, the client opens one more TCP connection after the stream JOINs (JOIN
// index = streams: the data socket, docs/wire.md); build_paths makes the devmem path over it.
//
// Offers: each side sets in its HELLO the path bits it can use (shm: Unix sockets and memfd work;
// cuda_ipc: CUDA IPC works here). The client also listens on a Unix socket for the shm side
// channel and names it in HELLO. The server, seeing the same host, connects to that socket at
// once and keeps only the bits it accepts (shm: the channel connected; cuda_ipc: the peer is
// another process), so both sides then pick paths from the same two HELLOs. The side channel is
// authenticated like a JOIN: the server's first message is the session id and a proof of the key.
// The client, having accepted the channel, creates the shared region; the server maps it.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/clock.h"
#include "engine/context_impl.h"
#include "engine/payload_path.h"
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

// Server: at HELLO. Clears the bits of `server` that it cannot accept for this client (different
// host, same process, shm channel unreachable) and connects the shm side channel, sending the
// session's proof on it. `why_not` gets the reasons.
void accept_paths(const ContextImpl& ctx, const wire::Hello& client, wire::Hello* server,
                  std::optional<shm::UnixChannel>* channel, std::string* why_not);

// Both sides, after the streams have joined: builds the agreed paths. The client accepts the side
// channel on `listener` and checks the server's proof; the server uses its connected `channel`.
// `data_socket`: the devmem data socket when devmem was agreed (the path takes it): the context's
// test factory makes the path, else make_devmem_path on CUDA device `devmem_gpu` (which adds the
// NIC flow rule for the connection).
Result<std::vector<std::unique_ptr<PayloadPath>>> build_paths(const ContextImpl& ctx, uint64_t agreed_bits,
                                                              const wire::Hello& client, const wire::Hello& server,
                                                              std::optional<shm::UnixListener> listener,
                                                              std::optional<shm::UnixChannel> channel,
                                                              UniqueFd data_socket, const std::string& peer,
                                                              Deadline deadline);

}  // namespace dmx
