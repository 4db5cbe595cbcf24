#include "engine/handshake.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "core/log.h"
#include "core/sys.h"
#include "engine/links.h"
#include "topo/advisor.h"
#include "engine/transport_setup.h"
#include "stream/socket.h"

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
  Status s = random_bytes(h.nonce.data(), h.nonce.size());
  assert(s.ok());
  (void)s;
  h.boot_id = ctx.boot_id();
  h.hostname = ctx.hostname().substr(0, 255);
  h.pid = static_cast<uint32_t>(::getpid());
  h.peer_timeout_ms = static_cast<uint32_t>(std::min<int64_t>(p.peer_timeout.count() / 1000, UINT32_MAX));
  h.checksum = static_cast<uint8_t>(p.checksum ? wire::Checksum::kCrc32c : wire::Checksum::kNone);
  h.multilink = p.multilink;
  if (std::string name = ctx.store_name(); !name.empty()) {
    h.name = ctx.directory()->job() + "/" + name;
    h.epoch = ctx.epoch();
  }
  return h;
}

void note_peer_identity(const ContextImpl& ctx, const wire::Hello& theirs, Session* s) {
  if (theirs.name.empty() || theirs.epoch == 0) return;
  std::string prefix = ctx.directory() ? ctx.directory()->job() + "/" : std::string();
  // A peer of our job is known by its name; one of another job keeps its job in the name.
  s->peer_name = !prefix.empty() && theirs.name.rfind(prefix, 0) == 0 ? theirs.name.substr(prefix.size()) : theirs.name;
  s->peer_epoch = theirs.epoch;
}

std::chrono::microseconds keepalive_for(const EngineParams& mine, const wire::Hello& theirs) {
  return std::min(mine.keepalive, std::chrono::microseconds(uint64_t{theirs.peer_timeout_ms} * 1000 / 4));
}

Status check_auth_modes(const AuthKey& mine, wire::AuthMode theirs, wire::Role my_role) {
  bool they_insecure = theirs == wire::AuthMode::kInsecure;
  if (mine.insecure == they_insecure) return Status();
  // Named by role, not "this side" / "the peer": the server's text reaches the client in a REJECT.
  bool client_insecure = my_role == wire::Role::kClient ? mine.insecure : they_insecure;
  return Status(Code::kAuth,
                fmt::format("the client {} but the server {}; set insecure on both sides or give both the same key",
                            client_insecure ? "runs insecure (no authentication)" : "authenticates with a key",
                            client_insecure ? "requires authentication" : "runs insecure (no authentication)"));
}

Status told_to_peer(const Status& why) {
  switch (why.code()) {
    case Code::kProtocol:  // what was wrong with the peer's own frames
    case Code::kAuth:      // keys or auth modes differ: said without the key
    case Code::kResourceExhausted:  // which cap refused it, so the peer knows why and when to retry
      return why;
    case Code::kUnavailable:
      return Status(why.code(), "the server and this client have no data path in common; the server's log says why");
    default:
      return Status(why.code(), "the server could not take the connection; its log says why");
  }
}

Result<Session> negotiate(const ContextImpl& ctx, const wire::Hello& client, const wire::Hello& server,
                          const std::string& peer, const std::string& why_not) {
  Session s;
  s.streams = wire::stream_sockets(server.streams);  // streams_ counts the control stream too
  s.chunk_size = server.chunk_size;
  s.peer = peer;
  s.checksum = std::max(client.checksum, server.checksum) == static_cast<uint8_t>(wire::Checksum::kCrc32c);
  PeerPair pair = peer_pair(client, server);
  DMX_ASSIGN_OR_RETURN(s.agreed, agree(ctx, client, server));
  const std::string& forced = ctx.params().transport;
  std::string detail = why_not.empty() ? "" : fmt::format(" ({})", why_not);
  std::string paths, roles;
  const Transport* on_streams = nullptr;
  bool forced_agreed = false;
  for (const auto& t : s.agreed) {
    forced_agreed = forced_agreed || t->name() == forced;
    if (t->gives() == Gives::kStreams) {
      on_streams = t.get();
      continue;  // said last: it carries every chunk, or the rest
    }
    if (t->gives() == Gives::kPath) paths += fmt::format("{}{}", paths.empty() ? "" : "+", t->name());
    roles += fmt::format("; {}", t->role(pair));
  }
  if (forced != "auto" && !forced_agreed)
    return Status(Code::kUnavailable, fmt::format("transport={} was forced, but the peers cannot use it{}", forced,
                                                  detail.empty() ? (pair.same_host ? "" : " (different hosts)")
                                                                 : detail));
  if (paths.empty() && on_streams == nullptr)
    return Status(Code::kUnavailable, fmt::format("no transport that carries payload was agreed{}", detail));
  // With a payload path every chunk header travels on stream 0 (their order is the paths'
  // sequence), so further streams would only carry keepalives: one stream.
  if (!paths.empty()) s.streams = 1;
  s.multilink = s.streams > 1 && wire::multilink_agreed(client, server);
  s.transport = paths.empty() ? std::string(on_streams->name()) : paths;
  std::string how = forced == "auto" ? "auto" : fmt::format("forced by configuration (transport={})", forced);
  std::string where = pair.same_host ? "same host" : "different hosts";
  // One stream (beside a path, or streams=1) may be the shm pipe: say stream 0, not whose.
  std::string rest = on_streams == nullptr || s.streams == 1
                         ? "inline on stream 0"
                         : fmt::format("{} ({} data streams)", on_streams->role(pair), server.streams);
  s.reason =
      fmt::format("{}: {}{}; {} {}{}", how, where, roles, paths.empty() ? "every chunk" : "the rest", rest, detail);
  // The sender's order per memory kind. Only a transport whose NIC touches device memory needs
  // the topology: the others rank by their costs alone, and no endpoint reads sysfs for them.
  RankingInputs in;
  in.agreed = s.agreed;
  in.pair = pair;
  in.forced = forced;
  in.devmem_ifname = ctx.config().get_string("devmem_ifname");
  if (ranking_needs_topology(s.agreed)) in.topo = ctx.topology(&in.topo_why);
  auto ranking = std::make_shared<TransportRanking>(std::move(in));
  s.reason += fmt::format("; ranked per memory kind (engine/ranking.h): {}", ranking->summary());
  s.ranking = std::move(ranking);
  return s;
}

Status send_frame(int fd, wire::FrameType type, const std::vector<unsigned char>& payload, Deadline deadline,
                  const std::string& peer, uint64_t a0) {
  wire::FrameHeader h;
  h.type = type;
  h.a0 = a0;
  h.payload_len = static_cast<uint32_t>(payload.size());
  wire::HeaderBytes b = wire::encode_header(h);
  DMX_RETURN_IF_ERROR(stream::send_exact(fd, b.data(), b.size(), deadline, peer));
  if (!payload.empty()) DMX_RETURN_IF_ERROR(stream::send_exact(fd, payload.data(), payload.size(), deadline, peer));
  return Status();
}

Result<Frame> recv_frame(int fd, Deadline deadline, const std::string& peer) {
  unsigned char b[wire::kHeaderSize];
  DMX_RETURN_IF_ERROR(stream::recv_exact(fd, b, sizeof b, deadline, peer));
  Frame f;
  auto h = wire::decode_header(b, wire::Limits{0, 0});
  if (!h.ok()) return h.status().with_peer(peer);
  f.header = *h;
  f.payload.resize(f.header.payload_len);  // bounded by kMaxControlPayload for handshake frames
  if (!f.payload.empty())
    DMX_RETURN_IF_ERROR(stream::recv_exact(fd, f.payload.data(), f.payload.size(), deadline, peer));
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

Result<UniqueFd> open_stream(const stream::Address& addr, const EngineParams& p, Deadline deadline,
                             const std::string& bind_device = {}, bool* refused = nullptr) {
  DMX_ASSIGN_OR_RETURN(UniqueFd fd, stream::connect_to(addr, deadline, bind_device, refused));
  stream::StreamOptions so;
  so.socket_buffer = p.socket_buffer;
  so.user_timeout_ms = stream::user_timeout_ms(p.peer_timeout);
  DMX_RETURN_IF_ERROR(stream::configure_stream(fd.get(), so));
  return fd;
}

// The interfaces the client's streams may use: the nics setting, else the NIC of nic_gpu's GPU
// (topo::nic_for_gpu: gpu_nics, else the nearest by PCIe), else all (empty).
std::string stream_nics(const ContextImpl& ctx) {
  const EngineParams& p = ctx.params();
  int64_t gpu = ctx.config().get_int("nic_gpu");
  if (!p.nics.empty() || gpu < 0) return p.nics;
  std::string why;
  auto topo = ctx.topology(&why);
  int dev = topo ? topo::gpu_of_ordinal(*topo, static_cast<int>(gpu)) : -1;
  if (dev < 0) {
    DMX_LOG_WARN("nic_gpu={}: no such GPU in the topology ({}); the streams use every NIC", gpu,
                 topo ? "not found" : why);
    return "";
  }
  topo::NicChoice c = topo::nic_for_gpu(*topo, dev, static_cast<int>(gpu), ctx.config().get_string("gpu_nics"));
  if (c.nic < 0) {
    DMX_LOG_WARN("nic_gpu={}: no NIC for it ({}); the streams use every NIC", gpu, c.why);
    return "";
  }
  DMX_LOG_DEBUG("nic_gpu={}: the streams use {} ({})", gpu, topo->nics[c.nic].name, c.why);
  return topo->nics[c.nic].name;
}

// One connect attempt: the handshake of every stream within `attempt`; the same-host paths within
// `overall`. *final says the failure is the peer's answer (REJECT, keys differ, a protocol
// mismatch), which another attempt would only repeat; *refused, that nobody listens at `addr`.
Result<std::shared_ptr<EndpointImpl>> connect_once(const std::shared_ptr<ContextImpl>& ctx, const stream::Address& addr,
                                                   const std::string& peer, Deadline attempt, Deadline overall,
                                                   bool* final, bool* refused) {
  const EngineParams& p = ctx->params();
  Deadline deadline = attempt;
  // Shadows the function: the peer's REJECT or a wrong frame is final.
  auto unexpected_reply = [final](const Frame& f, std::string_view waiting_for, const std::string& who) {
    *final = true;
    return dmx::unexpected_reply(f, waiting_for, who);
  };
  std::vector<UniqueFd> fds;
  DMX_ASSIGN_OR_RETURN(UniqueFd fd0, open_stream(addr, p, deadline, {}, refused));
  wire::Hello mine = make_hello(*ctx, wire::Role::kClient);
  std::optional<UnixListener> local_listener;
  std::string why_not;
  offer_transports(*ctx, &mine, &local_listener, &why_not);
  DMX_RETURN_IF_ERROR(send_frame(fd0.get(), wire::FrameType::kHello, wire::encode_hello(mine), deadline, peer));
  DMX_ASSIGN_OR_RETURN(Frame reply, recv_frame(fd0.get(), deadline, peer));
  if (reply.header.type != wire::FrameType::kHello) {
    Status refused_by_peer = unexpected_reply(reply, "HELLO", peer);
    // The server keeps its reasons to itself (told_to_peer): add ours, which may be the cause.
    if (refused_by_peer.code() == Code::kUnavailable && !why_not.empty())
      return Status(Code::kUnavailable, fmt::format("{}; this side: {}", refused_by_peer.message(), why_not))
          .with_peer(peer);
    return refused_by_peer;
  }
  auto theirs = wire::decode_hello(reply.payload.data(), reply.payload.size());
  if (!theirs.ok()) return theirs.status().with_peer(peer);
  *final = true;  // from here on, a failure is what the peer said, not what the network did
  if (theirs->role != wire::Role::kServer) return Status(Code::kProtocol, "the peer is not a dmx server").with_peer(peer);
  DMX_RETURN_IF_ERROR(check_auth_modes(ctx->auth(), theirs->auth, wire::Role::kClient).with_peer(peer));
  if (theirs->streams != mine.streams || theirs->chunk_size > mine.chunk_size)
    return Status(Code::kProtocol, "the server changed the stream count or raised the chunk size").with_peer(peer);
  uint64_t session = theirs->session;
  for (const wire::Offer& o : mine.offers)
    if (!theirs->offer(o.name))
      why_not += fmt::format("{}the server did not accept {} (see its log)", why_not.empty() ? "" : "; ", o.name);
  DMX_ASSIGN_OR_RETURN(Session agreed, negotiate(*ctx, mine, *theirs, peer, why_not));
  note_peer_identity(*ctx, *theirs, &agreed);
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

  // The streams, then a data socket for each agreed transport that needs one: JOIN index = streams
  // + k (docs/wire.md).
  size_t data = data_sockets_needed(agreed.agreed);
  std::vector<std::string> data_devices;  // per data socket, in agreed order
  for (const auto& t : agreed.agreed)
    if (t->needs().data_socket) data_devices.push_back(t->data_socket_device(ctx->config()));
  std::vector<UniqueFd> data_sockets;
  // Several links: data stream i leaves by link (i - 1) mod the links (engine/links.h).
  std::vector<Link> nic_links;
  if (agreed.multilink && !theirs->addresses.empty()) {
    std::string local = stream::local_name(fds[0].get());
    nic_links = plan_links(local.substr(0, local.rfind(':')), addr.host, theirs->addresses, stream_nics(*ctx));
  }
  // One link that is not stream 0's (nics or nic_gpu named another NIC) is worth following too.
  if (nic_links.size() == 1 && nic_links[0].remote == addr.host) nic_links.clear();
  if (!nic_links.empty())
    DMX_LOG_INFO("endpoint to {}: {} data streams over {} links: {}", peer, agreed.streams - 1, nic_links.size(),
                 describe_links(nic_links));
  for (uint16_t i = 1; i < agreed.streams + data; ++i) {
    std::string device = i < agreed.streams ? std::string() : data_devices[i - agreed.streams];
    stream::Address to = addr;
    if (i < agreed.streams && !nic_links.empty()) {
      const Link& l = nic_links[(i - 1) % nic_links.size()];
      to.host = l.remote;
      device = l.ifname;
    }
    auto opened = open_stream(to, p, deadline, device);
    // SO_BINDTODEVICE needs privileges on older kernels: the subnet's route then picks the NIC.
    if (!opened.ok() && opened.status().code() == Code::kUnavailable && i < agreed.streams && !device.empty())
      opened = open_stream(to, p, deadline);
    if (!opened.ok()) return opened.status();
    UniqueFd fd = std::move(*opened);
    wire::Join j;
    j.session = session;
    j.index = i;
    j.streams = agreed.streams;
    if (!ctx->auth().insecure) j.proof = make_proof(ctx->auth(), kJoinLabel, mine.nonce, theirs->nonce, session, i);
    DMX_RETURN_IF_ERROR(send_frame(fd.get(), wire::FrameType::kJoin, wire::encode_join(j), deadline, peer));
    DMX_ASSIGN_OR_RETURN(Frame ok, recv_frame(fd.get(), deadline, peer));
    if (ok.header.type != wire::FrameType::kWelcome)
      return unexpected_reply(ok, i < agreed.streams ? "WELCOME" : "WELCOME for a data socket", peer);
    (i < agreed.streams ? fds : data_sockets).push_back(std::move(fd));
  }
  agreed.keepalive = keepalive_for(p, *theirs);
  agreed.peer_eager_limit = theirs->eager_limit;
  agreed.peer_unexpected_budget = theirs->unexpected_budget;
  // The side channels' listener: only while an agreed transport needs one.
  bool channels = false;
  for (const auto& t : agreed.agreed) channels = channels || t->needs().side_channel;
  if (!channels) local_listener.reset();
  *final = true;  // the server has its endpoint now: a second attempt would make another
  DMX_ASSIGN_OR_RETURN(TransportLinks links,
                       connect_transports(*ctx, agreed.agreed, mine, *theirs, /*is_client=*/true,
                                          std::move(local_listener), SideChannels{}, std::move(data_sockets), peer,
                                          overall));
  agreed.routes = stream_routes(fds);
  agreed.session_id = session;
  agreed.client_nonce = mine.nonce;
  agreed.server_nonce = theirs->nonce;
  agreed.my_epoch = ctx->epoch();
  agreed.is_client = true;
  agreed.redial.push_back(peer);
  for (const std::string& a : theirs->addresses) {
    std::string to = a.find(':') != std::string::npos ? fmt::format("[{}]:{}", a, addr.port) : fmt::format("{}:{}", a, addr.port);
    if (to != peer && agreed.redial.size() < 1 + wire::kMaxAddresses) agreed.redial.push_back(to);
  }
  return EndpointImpl::create(ctx, std::move(agreed), stream_conduits(std::move(fds), std::move(links.control)),
                              std::move(links.paths));
}

}  // namespace

wire::Proof rejoin_proof(const AuthKey& key, const Session& s, uint16_t first, uint16_t index) {
  return make_proof(key, kRejoinLabel, s.client_nonce, s.server_nonce, s.session_id ^ (uint64_t{first} << 48), index);
}

Result<UniqueFd> rejoin_stream(const ContextImpl& ctx, const Session& s, const std::string& address, uint16_t first,
                               uint16_t index, Deadline deadline, RejoinOutcome* out) {
  DMX_ASSIGN_OR_RETURN(stream::Address addr, stream::parse_address(address));
  DMX_ASSIGN_OR_RETURN(UniqueFd fd, open_stream(addr, ctx.params(), deadline, {}, &out->refused));
  wire::Rejoin r;
  r.session = s.session_id;
  r.client_epoch = s.my_epoch;
  r.server_epoch = s.peer_epoch;
  r.first = first;
  r.index = index;
  if (!ctx.auth().insecure) r.proof = rejoin_proof(ctx.auth(), s, first, index);
  DMX_RETURN_IF_ERROR(send_frame(fd.get(), wire::FrameType::kRejoin, wire::encode_rejoin(r), deadline, address));
  out->sent = true;
  DMX_ASSIGN_OR_RETURN(Frame reply, recv_frame(fd.get(), deadline, address));
  if (reply.header.type != wire::FrameType::kWelcome) {
    out->sent = false;  // answered: it did not take the stream
    out->rejected = true;
    return unexpected_reply(reply, "WELCOME", address);
  }
  return fd;
}

// Attempts until connect_timeout: a reset connection, a handshake step past handshake_timeout or an
// EOF in the handshake is retried after a backoff (50 ms doubling to 1 s); the peer's answer
// (REJECT, keys differ) is returned at once, and so is a refusal — nobody listens, which another
// attempt only repeats — unless connect_retry_refused asks to wait for a listener that is starting.
Result<std::shared_ptr<EndpointImpl>> connect_endpoint(const std::shared_ptr<ContextImpl>& ctx,
                                                       const std::string& address) {
  DMX_ASSIGN_OR_RETURN(stream::Address addr, stream::parse_address(address));
  const EngineParams& p = ctx->params();
  DMX_RETURN_IF_ERROR(ctx->admit_endpoint(0));
  const auto start = Clock::now();
  Deadline overall = Deadline::after(p.connect_timeout);
  std::string peer = addr.to_string().substr(6);
  auto backoff = std::chrono::milliseconds(50);
  const bool retry_refused = ctx->config().get_bool("connect_retry_refused");
  bool warned_refused = false;
  for (int attempts = 1;; ++attempts) {
    bool final = false, refused = false;
    Deadline attempt = overall.earlier(Deadline::after(p.handshake_timeout));
    auto ep = connect_once(ctx, addr, peer, attempt, overall, &final, &refused);
    if (ep.ok()) return ep;
    Status s = ep.status();
    bool transient = s.code() == Code::kIo || s.code() == Code::kTimeout || s.code() == Code::kPeerFailed;
    auto left = overall.time() - Clock::now();
    if (refused && !retry_refused) {
      s = Status(s.code(), s.message() + " (connect_retry_refused=true waits for a listener that is starting)")
              .with_origin(s.origin());
      final = true;
    }
    if (final || !transient || left <= backoff) {
      if (attempts == 1) return s.with_peer(peer);
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      return Status(s.code(), fmt::format("{} (attempt {}, {} ms after connect began; connect_timeout {} ms)",
                                          s.message(), attempts, ms,
                                          std::chrono::duration_cast<std::chrono::milliseconds>(p.connect_timeout).count()))
          .with_peer(peer)
          .with_origin(s.origin());
    }
    if (refused && !warned_refused) {  // once per connect(): the wait is not silent
      warned_refused = true;
      DMX_LOG_WARN(
          "retrying connect to {} (refused: nobody listens there yet) for up to {} ms, until "
          "connect_timeout (connect_retry_refused=true)",
          peer, std::chrono::duration_cast<std::chrono::milliseconds>(left).count());
    }
    DMX_LOG_DEBUG("connect to {}: attempt {} failed ({}); retrying in {} ms", peer, attempts, s.to_string(),
                  backoff.count());
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

}  // namespace dmx
