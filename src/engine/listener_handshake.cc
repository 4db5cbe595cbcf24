// The server side of the handshake (docs/wire.md), one frame at a time on the listener thread:
// HELLO, AUTH, JOIN and REJOIN from a connection's bytes, then the endpoint's set-up on a thread
// of its own once every stream has joined. Every field is the peer's word, checked before use.
#include <fmt/format.h>
#include <fcntl.h>

#include "engine/links.h"
#include "engine/listener_impl.h"
#include "stream/socket.h"
#include "wire/le.h"

namespace dmx {

ListenerImpl::Next ListenerImpl::read_conn(Conn& c) {
  for (;;) {
    unsigned char* dst;
    size_t want;
    if (!c.in_payload) {
      dst = c.hdr + c.got;
      want = wire::kHeaderSize - c.got;
    } else {
      dst = c.payload.data() + c.got;
      want = c.payload.size() - c.got;
    }
    ssize_t k = ::recv(c.fd.get(), dst, want, 0);
    if (k == 0) {
      DMX_LOG_LIMITED(log_, info, "eof", "listener {}: peer {} closed the connection during the handshake", address_,
                      c.peer);
      return Next::kDrop;
    }
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Next::kKeep;
      DMX_LOG_LIMITED(log_, warn, "recv", "listener {}: peer {}: {}", address_, c.peer,
                      errno_status("recv", errno).message());
      return Next::kDrop;
    }
    c.got += static_cast<size_t>(k);
    if (!c.in_payload) {
      if (c.got < wire::kHeaderSize) continue;
      auto h = wire::decode_header(c.hdr, wire::Limits{0, 0});
      if (!h.ok()) return reject(c, h.status());
      c.h = *h;
      c.got = 0;
      c.payload.assign(c.h.payload_len, 0);  // at most kMaxControlPayload (checked by decode_header)
      c.in_payload = c.h.payload_len > 0;
      if (c.in_payload) continue;
    } else if (c.got < c.payload.size()) {
      continue;
    }
    c.in_payload = false;
    c.got = 0;
    Next n = handle(c);
    if (n != Next::kKeep) return n;
  }
}

ListenerImpl::Next ListenerImpl::handle(Conn& c) {
  switch (c.h.type) {
    case wire::FrameType::kHello: return c.awaiting_auth ? reject(c, Status(Code::kProtocol, "second HELLO")) : on_hello(c);
    case wire::FrameType::kAuth: return on_auth(c);
    case wire::FrameType::kJoin: return c.awaiting_auth ? reject(c, Status(Code::kProtocol, "JOIN before AUTH")) : on_join(c);
    case wire::FrameType::kRejoin:
      return c.awaiting_auth ? reject(c, Status(Code::kProtocol, "REJOIN before AUTH")) : on_rejoin(c);
    default:
      return reject(c, Status(Code::kProtocol, fmt::format("{} frame during the handshake",
                                                           wire::frame_type_name(c.h.type))));
  }
}

ListenerImpl::Next ListenerImpl::reject(Conn& c, const Status& why) {
  DMX_LOG_LIMITED(log_, warn, "refused", "listener {}: refused peer {}: {}", address_, c.peer,
                  printable(why.to_string()));
  // The peer has not authenticated: it hears what it needs, never this side's environment.
  std::string text = told_to_peer(why).message().substr(0, wire::kMaxControlPayload);
  // Best effort: the socket is fresh and the frame small, so this does not block.
  (void)send_frame(c.fd.get(), wire::FrameType::kReject, std::vector<unsigned char>(text.begin(), text.end()),
                   Deadline::after(std::chrono::milliseconds(100)), c.peer, static_cast<uint64_t>(why.code()));
  return Next::kDrop;
}

ListenerImpl::Next ListenerImpl::on_hello(Conn& c) {
  auto client = wire::decode_hello(c.payload.data(), c.payload.size());
  if (!client.ok() && c.payload.size() >= 2 && wire::get_u16(c.payload.data()) != wire::kProtocolVersion) {
    // The client reads this: decode_hello's "peer" (the client) would read as the server.
    uint16_t theirs = wire::get_u16(c.payload.data());
    return reject(c, Status(Code::kProtocol,
                            fmt::format("this client speaks dmx protocol {} and the server {}: the {} is older; both "
                                        "sides need the same dmx protocol",
                                        theirs, wire::kProtocolVersion, theirs < wire::kProtocolVersion ? "client"
                                                                                                           : "server")));
  }
  if (!client.ok()) return reject(c, client.status());
  if (client->role != wire::Role::kClient) return reject(c, Status(Code::kProtocol, "HELLO from a non-client"));
  if (Status s = check_auth_modes(ctx_->auth(), client->auth, wire::Role::kServer); !s.ok()) return reject(c, s);
  if (Status s = ctx_->admit_endpoint(client->streams, /*count_endpoints=*/false); !s.ok()) return reject(c, s);
  // One peer is one client process at one address (its host name and pid are the HELLO's, vouched
  // for by the key only after AUTH, so only authenticated endpoints count against it). The host
  // name keeps apart containers behind one NAT address, whose pids are alike.
  std::string key = fmt::format("{} ({}) pid {}", c.host, client->hostname, client->pid);
  if (Status s = check_peer_cap(key); !s.ok()) return reject(c, s);
  // At max_endpoints, a newcomer is refused now only when no endpoint could be evicted for it; the
  // eviction itself waits for its AUTH (an unauthenticated HELLO evicts nobody).
  if (Status s = endpoint_room(key, /*dry_run=*/true); !s.ok()) return reject(c, s);
  wire::Hello server = make_hello(*ctx_, wire::Role::kServer);
  server.streams = client->streams;  // the client decides; both are bounded by decode_hello
  if (server.multilink != 0 && client->multilink != 0 && client->streams > 1) {  // several NICs (engine/links.h)
    std::string local = stream::local_name(c.fd.get());
    server.addresses = advertised_addresses(listen_host_, local.substr(0, local.rfind(':')), ctx_->params().nics);
  }
  server.chunk_size = std::min(client->chunk_size, server.chunk_size);
  do {
    server.session = random_u64();
  } while (server.session == 0 || pending_.count(server.session));
  if (!ctx_->auth().insecure)
    server.proof = make_proof(ctx_->auth(), kServerLabel, client->nonce, server.nonce, server.session);
  SideChannels channels;
  std::string why_not;
  offer_transports(*ctx_, &server, nullptr, &why_not);
  accept_transports(*ctx_, *client, &server, &channels, &why_not);
  auto agreed = negotiate(*ctx_, *client, server, c.peer, why_not);
  if (!agreed.ok()) return reject(c, agreed.status());
  Status s = send_frame(c.fd.get(), wire::FrameType::kHello, wire::encode_hello(server),
                        Deadline::after(std::chrono::seconds(1)), c.peer);
  if (!s.ok()) {
    DMX_LOG_LIMITED(log_, warn, "send", "listener {}: peer {}: {}", address_, c.peer, s.message());
    return Next::kDrop;
  }
  Pending p;
  p.client = *client;
  p.server = server;
  p.fds.resize(agreed->streams);
  p.deadline = c.deadline;
  p.peer = c.peer;
  p.key = key;
  p.channels = std::move(channels);
  p.why_not = std::move(why_not);
  p.data.resize(data_sockets_needed(agreed->agreed));
  pending_[server.session] = std::move(p);
  c.awaiting_auth = server.session;
  if (ctx_->auth().insecure) return on_auth(c);
  return Next::kKeep;
}

ListenerImpl::Next ListenerImpl::on_auth(Conn& c) {
  auto it = pending_.find(c.awaiting_auth);
  if (c.awaiting_auth == 0 || it == pending_.end()) return reject(c, Status(Code::kProtocol, "AUTH without HELLO"));
  Pending& p = it->second;
  if (!ctx_->auth().insecure) {
    wire::Proof expect = make_proof(ctx_->auth(), kClientLabel, p.client.nonce, p.server.nonce, it->first);
    wire::Proof got{};
    if (c.payload.size() == got.size()) std::copy(c.payload.begin(), c.payload.end(), got.begin());
    if (c.payload.size() != got.size() || !proofs_equal(expect, got)) {
      pending_.erase(it);
      return reject(c, Status(Code::kAuth, "authentication failed: the client does not hold this host's dmx key"));
    }
  }
  // Refusals for the caps come before WELCOME: after it the client holds an endpoint.
  Status full = check_peer_cap(p.key);
  if (full.ok()) full = endpoint_room(p.key, /*dry_run=*/false);
  reap_setups(/*all=*/false);
  if (full.ok() && setups_.size() >= kMaxSetupThreads)
    full = Status(Code::kResourceExhausted,
                  fmt::format("the server refused peer {}: {} endpoint set-ups are still ending (the most at once); "
                              "try again",
                              p.key, setups_.size()));
  if (!full.ok()) {
    pending_.erase(it);
    return reject(c, full);
  }
  if (!send_frame(c.fd.get(), wire::FrameType::kWelcome, {}, Deadline::after(std::chrono::seconds(1)), c.peer).ok()) {
    pending_.erase(it);
    return Next::kDrop;
  }
  p.authed = true;
  p.fds[0] = std::move(c.fd);
  p.joined = 1;
  complete(it->first);
  return Next::kTaken;
}

ListenerImpl::Next ListenerImpl::on_join(Conn& c) {
  auto j = wire::decode_join(c.payload.data(), c.payload.size());
  if (!j.ok()) return reject(c, j.status());
  auto it = pending_.find(j->session);
  if (it == pending_.end() || !it->second.authed)
    return reject(c, Status(Code::kAuth, "JOIN for an unknown or unauthenticated session"));
  Pending& p = it->second;
  bool data = j->streams == p.fds.size() && j->index >= j->streams;  // a transport's data socket
  if (data && static_cast<size_t>(j->index - j->streams) >= p.data.size())  // index >= streams: no wrap
    return reject(c, Status(Code::kProtocol, fmt::format("JOIN for data socket {} (index {}), but the session agreed "
                                                         "{}",
                                                         j->index - j->streams, j->index, p.data.size())));
  if (j->streams != p.fds.size() || (data ? p.data[j->index - j->streams].valid() : p.fds[j->index].valid()))
    return reject(c, Status(Code::kProtocol, fmt::format("JOIN for stream {} of {} does not fit the session", j->index,
                                                         j->streams)));
  if (!ctx_->auth().insecure) {
    wire::Proof expect = make_proof(ctx_->auth(), kJoinLabel, p.client.nonce, p.server.nonce, it->first, j->index);
    if (!proofs_equal(expect, j->proof)) return reject(c, Status(Code::kAuth, "authentication failed for a JOIN"));
  }
  if (!send_frame(c.fd.get(), wire::FrameType::kWelcome, {}, Deadline::after(std::chrono::seconds(1)), c.peer).ok())
    return Next::kDrop;
  if (data) p.data[j->index - j->streams] = std::move(c.fd);
  else p.fds[j->index] = std::move(c.fd);
  ++p.joined;
  complete(it->first);
  return Next::kTaken;
}

// Routes a REJOIN to the live endpoint of its session; every refusal is logged (rate-limited) and
// told to the peer, and the connection dropped.
ListenerImpl::Next ListenerImpl::on_rejoin(Conn& c) {
  auto r = wire::decode_rejoin(c.payload.data(), c.payload.size());
  if (!r.ok()) return reject(c, r.status());
  std::shared_ptr<EndpointImpl> ep = ctx_->find_rejoinable(r->session);
  if (!ep && r->server_epoch != ctx_->epoch())
    return reject(c, Status(Code::kAuth, fmt::format("REJOIN for epoch {} of this peer, which runs epoch {}: it "
                                                     "restarted, and the session is gone",
                                                     r->server_epoch, ctx_->epoch())));
  if (!ep)
    return reject(c, Status(Code::kAuth, "REJOIN for a session this process does not hold: it restarted, or the "
                                         "endpoint ended"));
  const Session& s = ep->session();
  if (r->server_epoch != s.my_epoch)
    return reject(c, Status(Code::kAuth, fmt::format("REJOIN for epoch {} of this peer, but the session began in "
                                                     "epoch {}",
                                                     r->server_epoch, s.my_epoch)));
  if (r->client_epoch != s.peer_epoch)
    return reject(c, Status(Code::kAuth, fmt::format("REJOIN from epoch {} of the client, but the session began "
                                                     "with epoch {}: the client restarted",
                                                     r->client_epoch, s.peer_epoch)));
  if (!ctx_->auth().insecure && !proofs_equal(rejoin_proof(ctx_->auth(), s, r->first, r->index), r->proof))
    return reject(c, Status(Code::kAuth, "authentication failed for a REJOIN"));
  Status fits = ep->rejoin_fits(r->first, r->index);
  if (!fits.ok()) return reject(c, fits.code() == Code::kClosed ? Status(Code::kAuth, fits.message()) : fits);
  if (!send_frame(c.fd.get(), wire::FrameType::kWelcome, {}, Deadline::after(std::chrono::seconds(1)), c.peer).ok())
    return Next::kDrop;
  Status added = ep->add_stream(r->first, r->index, std::move(c.fd));
  if (!added.ok())
    DMX_LOG_LIMITED(log_, warn, "refused", "listener {}: peer {}: rejoined stream {} dropped: {}", address_, c.peer,
                    r->index, added.message());
  return Next::kTaken;
}

// Creates the endpoint once every stream has joined.
void ListenerImpl::complete(uint64_t session) {
  auto it = pending_.find(session);
  if (it == pending_.end() || it->second.joined < it->second.expected()) return;
  Pending p = std::move(it->second);
  pending_.erase(it);
  auto agreed = negotiate(*ctx_, p.client, p.server, p.peer, p.why_not);
  if (!agreed.ok()) return;  // checked at HELLO already
  note_peer_identity(*ctx_, p.client, &*agreed);
  agreed->keepalive = keepalive_for(ctx_->params(), p.client);
  agreed->peer_eager_limit = p.client.eager_limit;
  agreed->peer_unexpected_budget = p.client.unexpected_budget;
  // Same-host paths wait for the client to set up its side (up to the handshake deadline): that
  // must not stall this thread, which serves every other handshake.
  // Set-ups are bounded: at kMaxSetups the oldest one still in progress is evicted for this one (a
  // same-host peer that never sets up its side waits out its deadline otherwise, and enough of
  // them would lock everyone out). Set-ups of good peers take milliseconds, so the oldest is the
  // likeliest stalled. Threads in all are bounded at AUTH (kMaxSetupThreads).
  reap_setups(/*all=*/false);
  size_t active = 0;
  for (const auto& st : setups_) active += st.active() ? 1 : 0;
  if (active >= kMaxSetups) (void)evict_oldest_setup(p.peer);
  Setup st;
  st.done = std::make_shared<std::atomic<bool>>(false);
  st.state = std::make_shared<SetupState>();
  st.peer = p.peer;
  st.key = p.key;
  st.started = Clock::now();
  auto cut = [&st](int fd) {
    if (fd >= 0) st.cut.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  };
  for (const auto& fd : p.fds) cut(fd.get());
  for (const auto& fd : p.data) cut(fd.get());
  for (const auto& [name, ch] : p.channels) cut(ch.fd());
  std::erase_if(st.cut, [](const UniqueFd& fd) { return !fd.valid(); });
  building_.fetch_add(1, std::memory_order_acq_rel);
  st.thread = std::thread([this, p = std::move(p), a = std::move(*agreed), done = st.done, state = st.state]() mutable {
    build(std::move(p), std::move(a), std::move(state));
    done->store(true, std::memory_order_release);
    // The listener reaps it now: its dups in `cut` hold the sockets open, so a failed set-up's
    // peer would otherwise see no end until some other connection woke the listener.
    uint64_t one = 1;
    ssize_t rc = ::write(wake_.get(), &one, sizeof one);
    (void)rc;
  });
  setups_.push_back(std::move(st));
}

void ListenerImpl::build(Pending p, Session agreed, std::shared_ptr<SetupState> state) {
  auto links = connect_transports(*ctx_, agreed.agreed, p.client, p.server, /*is_client=*/false, std::nullopt,
                                  std::move(p.channels), std::move(p.data), p.peer, p.deadline);
  bool evicted = false;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    evicted = state->evicted;
    state->committed = links.ok() && !evicted;
  }
  if (!links.ok() || evicted) {
    if (evicted)
      DMX_LOG_LIMITED(log_, warn, "paths", "listener {}: peer {}: transport set-up ({}) evicted for a newer one "
                      "({} endpoints were being set up)", address_, p.peer, agreed.transport, kMaxSetups);
    else
      DMX_LOG_LIMITED(log_, warn, "paths", "listener {}: peer {}: transport set-up ({}) failed: {}", address_,
                      p.peer, agreed.transport, printable(links.status().message()));
    building_.fetch_sub(1, std::memory_order_acq_rel);
    return;  // dropping the streams tells the client
  }
  agreed.peer_key = p.key;
  // create() counts it in the context once its streams are built: a window of microseconds in which
  // max_endpoints may admit one more.
  building_.fetch_sub(1, std::memory_order_acq_rel);
  agreed.routes = stream_routes(p.fds);
  agreed.session_id = p.server.session;
  agreed.client_nonce = p.client.nonce;
  agreed.server_nonce = p.server.nonce;
  agreed.my_epoch = ctx_->epoch();
  auto ep = EndpointImpl::create(ctx_, std::move(agreed), stream_conduits(std::move(p.fds), std::move(links->control)),
                                 std::move(links->paths));
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_.push_back(std::move(ep));
  }
  cv_.notify_one();
}

}  // namespace dmx
