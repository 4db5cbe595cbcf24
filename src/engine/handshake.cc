#include "engine/handshake.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "core/log.h"
#include "core/sys.h"
#include "engine/local_paths.h"
#include "transport/tcp/socket.h"

namespace dmx {

wire::Hello make_hello(const ContextImpl& ctx, wire::Role role) {
  const EngineParams& p = ctx.params();
  wire::Hello h;
  h.version = wire::kProtocolVersion;
  h.role = role;
  h.auth = ctx.auth().insecure ? wire::AuthMode::kInsecure : wire::AuthMode::kHmacSha256;
  h.streams = p.streams;
  h.chunk_size = p.chunk_size;
  h.eager_limit = p.eager_limit;
  h.unexpected_budget = p.unexpected_budget;
  h.transports = wire::kTransportTcp;
  Status s = random_bytes(h.nonce.data(), h.nonce.size());
  assert(s.ok());
  (void)s;
  h.boot_id = ctx.boot_id();
  h.hostname = ctx.hostname().substr(0, 255);
  h.pid = static_cast<uint32_t>(::getpid());
  h.peer_timeout_ms = static_cast<uint32_t>(std::min<int64_t>(p.peer_timeout.count() / 1000, UINT32_MAX));
  return h;
}

std::chrono::microseconds keepalive_for(const EngineParams& mine, const wire::Hello& theirs) {
  return std::min(mine.keepalive, std::chrono::microseconds(uint64_t{theirs.peer_timeout_ms} * 1000 / 4));
}

Status check_auth_modes(const AuthKey& mine, wire::AuthMode theirs) {
  bool they_insecure = theirs == wire::AuthMode::kInsecure;
  if (mine.insecure == they_insecure) return Status();
  if (mine.insecure)
    return Status(Code::kAuth, "the peer requires authentication but this side runs insecure (both must agree)");
  return Status(Code::kAuth, "the peer runs without authentication (insecure) but this side requires it; "
                             "set insecure on both sides or give both the same key");
}

Result<Session> negotiate(const ContextImpl& ctx, const wire::Hello& client, const wire::Hello& server,
                          const std::string& peer, const std::string& why_not) {
  Session s;
  s.streams = server.streams;
  s.chunk_size = server.chunk_size;
  s.peer = peer;
  bool same_host = client.boot_id == server.boot_id && client.hostname == server.hostname && !client.boot_id.empty();
  uint64_t common = client.transports & server.transports;
  if ((common & wire::kTransportTcp) == 0) return Status(Code::kUnavailable, "the peers share no data path");
  const std::string& forced = ctx.params().transport;
  std::string detail = why_not.empty() ? "" : fmt::format(" ({})", why_not);
  uint64_t local = common & (wire::kTransportShm | wire::kTransportCudaIpc);
  // devmem: both HELLOs carry the bit. The server keeps it for a same-host client only when it is
  // forced to devmem (accept_paths), so the bit alone decides, the same way on both sides.
  bool devmem = (common & wire::kTransportDevmem) != 0;
  if (forced == "devmem" && !devmem)
    return Status(Code::kUnavailable,
                  fmt::format("transport=devmem was forced, but the peers cannot use it{}",
                              detail.empty() ? fmt::format(" (the {} does not offer devmem)",
                                                           (client.transports & wire::kTransportDevmem) ? "server"
                                                                                                       : "client")
                                             : detail));
  if (devmem) {
    s.paths = wire::kTransportDevmem;
    s.transport = "devmem";
    s.reason = fmt::format("{}: device sources go by devmem on a dedicated data socket when the receiver's buffer "
                           "accepts it, everything else inline on the TCP streams{}",
                           forced == "devmem" ? "forced by configuration (transport=devmem)"
                                              : same_host ? "devmem agreed (the server is forced to devmem)"
                                                          : "auto: different hosts, both offer devmem",
                           ctx.devmem_factory() ? fmt::format(" (this side's devmem is a test double){}", detail)
                                                : detail);
    return s;
  }
  if (forced == "shm" || forced == "cuda_ipc") {
    uint64_t bit = forced == "shm" ? uint64_t{wire::kTransportShm} : uint64_t{wire::kTransportCudaIpc};
    if ((local & bit) == 0)
      return Status(Code::kUnavailable, fmt::format("transport={} was forced, but the peers cannot use it{}", forced,
                                                    detail.empty() ? (same_host ? "" : " (different hosts)") : detail));
    local = bit;
  }
  if (forced == "tcp") local = 0;
  bool pipe = (common & wire::kTransportControlPipe) != 0;
  s.paths = local | (pipe ? uint64_t{wire::kTransportControlPipe} : 0);
  if (local == (wire::kTransportShm | wire::kTransportCudaIpc)) {
    s.transport = "shm+cuda_ipc";
    s.reason = fmt::format("same host: device sources go by cuda_ipc, everything else through shm{}", detail);
  } else if (local == wire::kTransportShm) {
    s.transport = "shm";
    s.reason = fmt::format("same host: payloads go through shm{}", detail);
  } else if (local == wire::kTransportCudaIpc) {
    s.transport = "cuda_ipc";
    s.reason = fmt::format("same host: device sources go by cuda_ipc, host sources inline on stream 0{}", detail);
  } else {
    s.transport = "tcp";
    s.reason = forced == "tcp" ? "forced by configuration (transport=tcp)"
                               : fmt::format("auto: {}{}", same_host ? "same host, no same-host path agreed"
                                                                     : "different hosts, devmem not agreed",
                                             detail);
  }
  if (forced == "shm" || forced == "cuda_ipc")
    s.reason = fmt::format("forced by configuration (transport={}); {}", forced, s.reason);
  if ((local & wire::kTransportCudaIpc) && client.pid == server.pid)
    s.reason += " (one process: cuda_ipc copies from the sender's own pointers)";
  if (pipe) s.reason += "; control stream on an shm pipe";
  return s;
}

Status send_frame(int fd, wire::FrameType type, const std::vector<unsigned char>& payload, Deadline deadline,
                  const std::string& peer, uint64_t a0) {
  wire::FrameHeader h;
  h.type = type;
  h.a0 = a0;
  h.payload_len = static_cast<uint32_t>(payload.size());
  wire::HeaderBytes b = wire::encode_header(h);
  DMX_RETURN_IF_ERROR(tcp::send_exact(fd, b.data(), b.size(), deadline, peer));
  if (!payload.empty()) DMX_RETURN_IF_ERROR(tcp::send_exact(fd, payload.data(), payload.size(), deadline, peer));
  return Status();
}

Result<Frame> recv_frame(int fd, Deadline deadline, const std::string& peer) {
  unsigned char b[wire::kHeaderSize];
  DMX_RETURN_IF_ERROR(tcp::recv_exact(fd, b, sizeof b, deadline, peer));
  Frame f;
  auto h = wire::decode_header(b, wire::Limits{0, 0});
  if (!h.ok()) return h.status().with_peer(peer);
  f.header = *h;
  f.payload.resize(f.header.payload_len);  // bounded by kMaxControlPayload for handshake frames
  if (!f.payload.empty()) DMX_RETURN_IF_ERROR(tcp::recv_exact(fd, f.payload.data(), f.payload.size(), deadline, peer));
  return f;
}

namespace {

// Turns a REJECT or an unexpected frame into the error to report.
Status unexpected_reply(const Frame& f, std::string_view waiting_for, const std::string& peer) {
  if (f.header.type == wire::FrameType::kReject) {
    Code code = f.header.a0 > 0 && f.header.a0 <= static_cast<uint64_t>(Code::kInternal) ? static_cast<Code>(f.header.a0)
                                                                                         : Code::kProtocol;
    return Status(code, fmt::format("the peer refused the connection: {}",
                                    std::string(f.payload.begin(), f.payload.end())))
        .with_peer(peer);
  }
  return Status(Code::kProtocol, fmt::format("expected {} but the peer sent {}", waiting_for,
                                             wire::frame_type_name(f.header.type)))
      .with_peer(peer);
}

Result<UniqueFd> open_stream(const tcp::Address& addr, const EngineParams& p, Deadline deadline) {
  DMX_ASSIGN_OR_RETURN(UniqueFd fd, tcp::connect_to(addr, deadline));
  tcp::StreamOptions so;
  so.socket_buffer = p.socket_buffer;
  so.user_timeout_ms = static_cast<unsigned>(p.peer_timeout.count() / 1000);
  DMX_RETURN_IF_ERROR(tcp::configure_stream(fd.get(), so));
  return fd;
}

// One connect attempt: the handshake of every stream within `attempt`; the same-host paths within
// `overall`. *final says the failure is the peer's answer (REJECT, keys differ, a protocol
// mismatch), which another attempt would only repeat.
Result<std::shared_ptr<EndpointImpl>> connect_once(const std::shared_ptr<ContextImpl>& ctx, const tcp::Address& addr,
                                                   const std::string& peer, Deadline attempt, Deadline overall,
                                                   bool* final) {
  const EngineParams& p = ctx->params();
  Deadline deadline = attempt;
  // Shadows the function: the peer's REJECT or a wrong frame is final.
  auto unexpected_reply = [final](const Frame& f, std::string_view waiting_for, const std::string& who) {
    *final = true;
    return dmx::unexpected_reply(f, waiting_for, who);
  };
  std::vector<UniqueFd> fds;
  DMX_ASSIGN_OR_RETURN(UniqueFd fd0, open_stream(addr, p, deadline));
  wire::Hello mine = make_hello(*ctx, wire::Role::kClient);
  std::optional<shm::UnixListener> local_listener;
  std::string why_not;
  offer_paths(*ctx, &mine, &local_listener, &why_not);
  DMX_RETURN_IF_ERROR(send_frame(fd0.get(), wire::FrameType::kHello, wire::encode_hello(mine), deadline, peer));
  DMX_ASSIGN_OR_RETURN(Frame reply, recv_frame(fd0.get(), deadline, peer));
  if (reply.header.type != wire::FrameType::kHello) return unexpected_reply(reply, "HELLO", peer);
  auto theirs = wire::decode_hello(reply.payload.data(), reply.payload.size());
  if (!theirs.ok()) return theirs.status().with_peer(peer);
  *final = true;  // from here on, a failure is what the peer said, not what the network did
  if (theirs->role != wire::Role::kServer) return Status(Code::kProtocol, "the peer is not a dmx server").with_peer(peer);
  DMX_RETURN_IF_ERROR(check_auth_modes(ctx->auth(), theirs->auth).with_peer(peer));
  if (theirs->streams != mine.streams || theirs->chunk_size > mine.chunk_size)
    return Status(Code::kProtocol, "the server changed the stream count or raised the chunk size").with_peer(peer);
  uint64_t session = theirs->session;
  for (uint64_t bit : {uint64_t{wire::kTransportShm}, uint64_t{wire::kTransportCudaIpc}, uint64_t{wire::kTransportDevmem}})
    if ((mine.transports & bit) && !(theirs->transports & bit))
      why_not += fmt::format("{}the server did not accept {} (see its log)", why_not.empty() ? "" : "; ",
                             bit == wire::kTransportShm ? "shm" : bit == wire::kTransportCudaIpc ? "cuda_ipc" : "devmem");
  DMX_ASSIGN_OR_RETURN(Session agreed, negotiate(*ctx, mine, *theirs, peer, why_not));
  if (!ctx->auth().insecure) {
    wire::Proof expect = make_proof(ctx->auth(), kServerLabel, mine.nonce, theirs->nonce, session);
    if (!proofs_equal(expect, theirs->proof))
      return Status(Code::kAuth, "the server could not prove it holds the dmx key (keys differ)").with_peer(peer);
    wire::Proof proof = make_proof(ctx->auth(), kClientLabel, mine.nonce, theirs->nonce, session);
    DMX_RETURN_IF_ERROR(send_frame(fd0.get(), wire::FrameType::kAuth,
                                   std::vector<unsigned char>(proof.begin(), proof.end()), deadline, peer));
  }
  *final = false;  // a lost connection or a slow step from here on is worth another attempt
  DMX_ASSIGN_OR_RETURN(Frame welcome, recv_frame(fd0.get(), deadline, peer));
  if (welcome.header.type != wire::FrameType::kWelcome) return unexpected_reply(welcome, "WELCOME", peer);
  fds.push_back(std::move(fd0));

  for (uint16_t i = 1; i < mine.streams; ++i) {
    DMX_ASSIGN_OR_RETURN(UniqueFd fd, open_stream(addr, p, deadline));
    wire::Join j;
    j.session = session;
    j.index = i;
    j.streams = mine.streams;
    if (!ctx->auth().insecure) j.proof = make_proof(ctx->auth(), kJoinLabel, mine.nonce, theirs->nonce, session, i);
    DMX_RETURN_IF_ERROR(send_frame(fd.get(), wire::FrameType::kJoin, wire::encode_join(j), deadline, peer));
    DMX_ASSIGN_OR_RETURN(Frame ok, recv_frame(fd.get(), deadline, peer));
    if (ok.header.type != wire::FrameType::kWelcome) return unexpected_reply(ok, "WELCOME", peer);
    fds.push_back(std::move(fd));
  }
  // The devmem data socket: one more connection, JOIN index = streams, carrying payload only.
  UniqueFd data_socket;
  if (agreed.paths & wire::kTransportDevmem) {
    DMX_ASSIGN_OR_RETURN(UniqueFd fd, open_stream(addr, p, deadline));
    wire::Join j;
    j.session = session;
    j.index = mine.streams;
    j.streams = mine.streams;
    if (!ctx->auth().insecure)
      j.proof = make_proof(ctx->auth(), kJoinLabel, mine.nonce, theirs->nonce, session, mine.streams);
    DMX_RETURN_IF_ERROR(send_frame(fd.get(), wire::FrameType::kJoin, wire::encode_join(j), deadline, peer));
    DMX_ASSIGN_OR_RETURN(Frame ok, recv_frame(fd.get(), deadline, peer));
    if (ok.header.type != wire::FrameType::kWelcome) return unexpected_reply(ok, "WELCOME for the devmem data socket", peer);
    data_socket = std::move(fd);
  }
  agreed.keepalive = keepalive_for(p, *theirs);
  agreed.peer_eager_limit = theirs->eager_limit;
  agreed.peer_unexpected_budget = theirs->unexpected_budget;
  // The side channels' listener: shm, the control pipe and cuda_ipc's fd channel each have one.
  if ((agreed.paths & (wire::kTransportShm | wire::kTransportControlPipe | wire::kTransportCudaIpc)) == 0)
    local_listener.reset();
  *final = true;  // the server has its endpoint now: a second attempt would make another
  DMX_ASSIGN_OR_RETURN(LocalLinks links, build_paths(*ctx, agreed.paths, mine, *theirs, std::move(local_listener),
                                                      LocalChannels{}, std::move(data_socket), peer, overall));
  return EndpointImpl::create(ctx, std::move(agreed), stream_conduits(std::move(fds), std::move(links.control)),
                              std::move(links.paths));
}


}  // namespace

// Attempts until connect_timeout: a refused or reset connection, a handshake step past
// handshake_timeout or an EOF in the handshake is retried after a backoff (50 ms doubling to 1 s);
// the peer's answer (REJECT, keys differ) is returned at once.
Result<std::shared_ptr<EndpointImpl>> connect_endpoint(const std::shared_ptr<ContextImpl>& ctx,
                                                       const std::string& address) {
  DMX_ASSIGN_OR_RETURN(tcp::Address addr, tcp::parse_address(address));
  const EngineParams& p = ctx->params();
  DMX_RETURN_IF_ERROR(ctx->admit_endpoint(0));
  const auto start = Clock::now();
  Deadline overall = Deadline::after(p.connect_timeout);
  std::string peer = addr.to_string().substr(6);
  auto backoff = std::chrono::milliseconds(50);
  for (int attempts = 1;; ++attempts) {
    bool final = false;
    Deadline attempt = overall.earlier(Deadline::after(p.handshake_timeout));
    auto ep = connect_once(ctx, addr, peer, attempt, overall, &final);
    if (ep.ok()) return ep;
    Status s = ep.status();
    bool transient = s.code() == Code::kIo || s.code() == Code::kTimeout || s.code() == Code::kPeerFailed;
    auto left = overall.time() - Clock::now();
    if (final || !transient || left <= backoff) {
      if (attempts == 1) return s.with_peer(peer);
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      return Status(s.code(), fmt::format("{} (attempt {}, {} ms after connect began; connect_timeout {} ms)",
                                          s.message(), attempts, ms,
                                          std::chrono::duration_cast<std::chrono::milliseconds>(p.connect_timeout).count()))
          .with_peer(peer)
          .with_origin(s.origin());
    }
    DMX_LOG_DEBUG("connect to {}: attempt {} failed ({}); retrying in {} ms", peer, attempts, s.to_string(),
                  backoff.count());
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

}  // namespace dmx
