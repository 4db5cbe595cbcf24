// Listener: accepts connections and runs the server side of the handshake as a non-blocking
// state machine on one thread, each connection with its own deadline — so a peer that connects
// and says nothing, or says garbage, delays nobody else. Pre-auth connections are bounded in all
// (max_pending_handshakes) and per address (max_pending_per_address); at either cap the oldest
// (of that address, one that has sent nothing first) is evicted for the new one and told why in a
// REJECT. Authenticated peers (address + process) are bounded by max_endpoints_per_peer below
// max_endpoints; endpoint set-ups by kMaxSetups, the oldest evicted for a new one. When the
// process is out of fds, accepting pauses for kAcceptPause instead of spinning. Every line a peer
// can cause goes through log_ (one per kind per second).
#include <fmt/format.h>
#include <poll.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <list>
#include <thread>
#include <unordered_map>

#include "core/log.h"
#include "dmx/context.h"
#include "engine/handshake.h"
#include "engine/links.h"
#include "engine/transport_setup.h"
#include "stream/socket.h"
#include "wire/le.h"

namespace dmx {

class ListenerImpl : public std::enable_shared_from_this<ListenerImpl> {
 public:
  static Result<std::shared_ptr<ListenerImpl>> create(std::shared_ptr<ContextImpl> ctx, const std::string& url);
  ~ListenerImpl();
  Result<Endpoint> accept(Duration timeout);
  const std::string& address() const { return address_; }
  void close();

 private:
  struct Conn {
    UniqueFd fd;
    std::string peer;
    std::string host;  // the peer's address without the port (per-address cap)
    Deadline deadline;
    unsigned char hdr[wire::kHeaderSize];
    size_t got = 0;
    bool in_payload = false;
    wire::FrameHeader h;
    std::vector<unsigned char> payload;
    uint64_t awaiting_auth = 0;  // session id whose AUTH this connection owes
    Clock::time_point since;     // accepted
    bool spoke() const { return got > 0 || in_payload || awaiting_auth != 0; }
  };
  struct Pending {  // an endpoint whose streams are still joining
    wire::Hello client, server;
    bool authed = false;
    std::vector<UniqueFd> fds;
    size_t joined = 0;
    Deadline deadline;
    std::string peer;
    std::string key;                // the peer for max_endpoints_per_peer: "address pid N"
    SideChannels channels;          // of the agreed transports that need one
    std::string why_not;            // reasons for transports not used
    std::vector<UniqueFd> data;     // data sockets: JOIN index fds.size() + k
    size_t expected() const { return fds.size() + data.size(); }
  };
  enum class Next { kKeep, kDrop, kTaken };

  explicit ListenerImpl(std::shared_ptr<ContextImpl> ctx) : ctx_(std::move(ctx)) {}
  void run();
  void accept_new();
  // Every removal from conns_ goes here: it keeps per_host_ true and drops a session that owed AUTH.
  std::list<Conn>::iterator drop_conn(std::list<Conn>::iterator it);
  Next read_conn(Conn& c);
  Next handle(Conn& c);
  Next on_hello(Conn& c);
  Next on_auth(Conn& c);
  Next on_join(Conn& c);
  Next on_rejoin(Conn& c);  // reconnect: a new stream of a live endpoint (endpoint/reconnect.cc)
  Next reject(Conn& c, const Status& why);
  // Best effort, no log line: tells the peer why it is dropped (a REJECT frame).
  static void tell(Conn& c, const Status& why);
  // Makes room for a new connection from `host`: at max_pending_per_address its oldest connection
  // (one that has sent nothing, else any), at max_pending_handshakes the oldest of all, is told why
  // and dropped.
  // False when the newcomer itself is refused: every connection of its address is younger than
  // kEvictGrace (evicting them would evict a client that has not had time to speak).
  bool make_room(const std::string& host, const std::string& newcomer);
  // kResourceExhausted naming max_endpoints_per_peer when `key` holds that many endpoints (open,
  // authenticated and joining, or being set up).
  Status check_peer_cap(const std::string& key) const;
  // At max_endpoints: makes room for one endpoint of peer `key` by evicting an idle endpoint of
  // the peer that holds the most (ContextImpl::evict_idle_endpoint; dry_run: only whether one
  // could be); kResourceExhausted saying why not.
  Status endpoint_room(const std::string& key, bool dry_run);
  void complete(uint64_t session);
  struct SetupState;
  void build(Pending p, Session agreed, std::shared_ptr<SetupState> state);  // a set-up thread
  void reap_setups(bool all);

  std::shared_ptr<ContextImpl> ctx_;
  UniqueFd fd_, wake_;
  std::string address_;
  std::string listen_host_;  // as asked: a wildcard takes streams on every interface (engine/links.h)
  std::thread thread_;
  // Listener thread only.
  std::list<Conn> conns_;  // oldest first
  std::unordered_map<std::string, size_t> per_host_;  // conns_ by Conn::host
  Clock::time_point accept_paused_until_;             // out of fds: the listen socket rests until then
  size_t max_pending_ = 1024, max_per_host_ = 64;     // from the configuration
  LogLimiter log_{std::chrono::seconds(1)};  // thread-safe
  // Threads building same-host paths, each bounded by its handshake deadline; joined by run().
  struct SetupState {
    std::mutex mu;           // guards the two flags
    bool committed = false;  // its endpoint is being created: no longer evicted
    bool evicted = false;    // cut: its sockets were shut down, it drops the endpoint
  };
  struct Setup {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
    std::shared_ptr<SetupState> state;
    std::vector<UniqueFd> cut;  // dups of its sockets and side channels: shutdown() ends its waits
    std::string peer, key;
    Clock::time_point started;
    bool active() const;  // neither done, committed nor evicted
  };
  // Evicts the oldest active set-up (for a newcomer, `why`); false when none can be.
  bool evict_oldest_setup(const std::string& newcomer);
  std::list<Setup> setups_;
  std::atomic<int> building_{0};  // set-up threads that have not yet created (or given up) their endpoint
  std::unordered_map<uint64_t, Pending> pending_;
  // Shared with accept().
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<EndpointImpl>> ready_;
  bool closed_ = false;
};

namespace {
// Out of fds (EMFILE/ENFILE), accept would fail at once and the listen socket stay readable: rest it
// this long rather than spin on it. Handshakes in progress keep going meanwhile.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
// Endpoints being built at once (each a thread for at most handshake_timeout); beyond, refused.
constexpr size_t kMaxSetups = 64;
// At max_pending_per_address, connections younger than this are not evicted: a client sends its
// HELLO within a round trip, and a flood that reopens each evicted connection at once would
// otherwise evict it before it could.
constexpr auto kEvictGrace = std::chrono::milliseconds(250);
// Set-up threads in all, evicted ones not yet gone included; beyond, a new session is refused at
// AUTH (before its WELCOME), so a client never sees a handshake succeed that the server dropped.
constexpr size_t kMaxSetupThreads = 2 * kMaxSetups;

std::string host_of(const std::string& peer) {  // "1.2.3.4:5" or "[::1]:5" -> without the port
  auto colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}
}  // namespace

Result<std::shared_ptr<ListenerImpl>> ListenerImpl::create(std::shared_ptr<ContextImpl> ctx, const std::string& url) {
  DMX_ASSIGN_OR_RETURN(stream::Address addr, stream::parse_address(url));
  auto l = std::shared_ptr<ListenerImpl>(new ListenerImpl(std::move(ctx)));
  DMX_ASSIGN_OR_RETURN(l->fd_, stream::listen_on(addr));
  l->listen_host_ = addr.host;
  l->wake_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!l->wake_.valid()) return errno_status("eventfd", errno);
  std::string local = stream::local_name(l->fd_.get());
  l->address_ = "tcp://" + local;
  l->max_pending_ = static_cast<size_t>(std::max<int64_t>(1, l->ctx_->config().get_int("max_pending_handshakes")));
  l->max_per_host_ = static_cast<size_t>(std::max<int64_t>(1, l->ctx_->config().get_int("max_pending_per_address")));
  l->thread_ = std::thread([raw = l.get()] { raw->run(); });
  DMX_LOG_INFO("listening on {} (auth: {})", l->address_, l->ctx_->auth().source);
  return l;
}

ListenerImpl::~ListenerImpl() { close(); }

void ListenerImpl::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
  }
  uint64_t one = 1;
  ssize_t rc = ::write(wake_.get(), &one, sizeof one);
  (void)rc;
  if (thread_.joinable()) thread_.join();
  cv_.notify_all();
  std::deque<std::shared_ptr<EndpointImpl>> unaccepted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    unaccepted.swap(ready_);
  }
  // Endpoints nobody accepted: closed here, so that their workers have stopped when the listener
  // is gone (a dropped pointer alone left them running, racing the process's exit).
  for (auto& ep : unaccepted) (void)ep->close();
}

Result<Endpoint> ListenerImpl::accept(Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [&] { return !ready_.empty() || closed_; };
  if (timeout == kForever) cv_.wait(lock, ready);
  else if (!cv_.wait_for(lock, timeout, ready))
    return Status(Code::kTimeout, fmt::format("no peer connected to {} in time", address_));
  if (ready_.empty()) return Status(Code::kClosed, fmt::format("listener {} is closed", address_));
  auto ep = std::move(ready_.front());
  ready_.pop_front();
  return Endpoint(std::move(ep));
}

void ListenerImpl::run() {
  std::vector<pollfd> fds;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) break;
    }
    Deadline next;
    for (auto& c : conns_) next = next.earlier(c.deadline);
    for (auto& [id, p] : pending_) next = next.earlier(p.deadline);
    const bool resting = Clock::now() < accept_paused_until_;
    if (resting) next = next.earlier(Deadline::at(accept_paused_until_));
    fds.assign({{fd_.get(), static_cast<short>(resting ? 0 : POLLIN), 0}, {wake_.get(), POLLIN, 0}});
    for (auto& c : conns_) fds.push_back({c.fd.get(), POLLIN, 0});
    int rc = ::poll(fds.data(), fds.size(), next.poll_timeout_ms());
    if (rc < 0 && errno != EINTR) {
      DMX_LOG_ERROR("listener {}: {}", address_, errno_status("poll", errno).message());
      break;
    }
    if (fds[1].revents & POLLIN) {  // a set-up ended (or close(), seen at the top)
      uint64_t n = 0;
      ssize_t r = ::read(wake_.get(), &n, sizeof n);
      (void)r;
    }
    size_t i = 2;
    for (auto it = conns_.begin(); it != conns_.end(); ++i) {
      Next n = Next::kKeep;
      if (i < fds.size() && fds[i].revents) n = read_conn(*it);
      if (n == Next::kKeep && it->deadline.expired()) {
        DMX_LOG_LIMITED(log_, warn, "slow", "listener {}: peer {} did not complete the handshake in time; dropped",
                        address_, it->peer);
        tell(*it, Status(Code::kTimeout,
                         fmt::format("the server dropped this connection: its handshake did not complete within {} ms "
                                     "(handshake_timeout)",
                                     std::chrono::duration_cast<std::chrono::milliseconds>(
                                         ctx_->params().handshake_timeout)
                                         .count())));
        n = Next::kDrop;
      }
      it = n == Next::kKeep ? std::next(it) : drop_conn(it);
    }
    // After the walk above: accepting may evict from conns_, whose order fds mirrors.
    if (fds[0].revents & POLLIN) accept_new();
    reap_setups(/*all=*/false);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.deadline.expired()) {
        DMX_LOG_LIMITED(log_, warn, "joins", "listener {}: peer {} opened {} of {} connections before the deadline; dropped",
                        address_, it->second.peer, it->second.joined, it->second.expected());
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  conns_.clear();
  per_host_.clear();
  pending_.clear();
  reap_setups(/*all=*/true);
}

void ListenerImpl::reap_setups(bool all) {
  for (auto it = setups_.begin(); it != setups_.end();) {
    if (!all && !it->done->load(std::memory_order_acquire)) {
      ++it;
      continue;
    }
    if (all) {  // closing: nothing waits for the rest of a set-up
      std::lock_guard<std::mutex> lock(it->state->mu);
      if (!it->state->committed) {
        it->state->evicted = true;
        for (auto& fd : it->cut) ::shutdown(fd.get(), SHUT_RDWR);
      }
    }
    it->thread.join();
    it = setups_.erase(it);
  }
}

bool ListenerImpl::Setup::active() const {
  if (done->load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(state->mu);
  return !state->committed && !state->evicted;
}

bool ListenerImpl::evict_oldest_setup(const std::string& newcomer) {
  for (auto& st : setups_) {  // oldest first
    if (st.done->load(std::memory_order_acquire)) continue;
    std::lock_guard<std::mutex> lock(st.state->mu);
    if (st.state->committed || st.state->evicted) continue;
    st.state->evicted = true;
    for (auto& fd : st.cut) ::shutdown(fd.get(), SHUT_RDWR);  // its waits end at once, its client sees EOF
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - st.started).count();
    DMX_LOG_LIMITED(log_, warn, "setup-evict", "listener {}: {} endpoints are being set up (the most); evicting the "
                    "oldest, peer {}'s ({} ms in set-up), for peer {}", address_, kMaxSetups, st.peer, ms, newcomer);
    return true;
  }
  return false;
}

void ListenerImpl::tell(Conn& c, const Status& why) {
  std::string text = why.message().substr(0, wire::kMaxControlPayload);
  // Best effort: the frame is small and the socket's buffer nearly empty, so this does not block.
  (void)send_frame(c.fd.get(), wire::FrameType::kReject, std::vector<unsigned char>(text.begin(), text.end()),
                   Deadline::after(std::chrono::milliseconds(100)), c.peer, static_cast<uint64_t>(why.code()));
}

bool ListenerImpl::make_room(const std::string& host, const std::string& newcomer) {
  auto known = per_host_.find(host);
  if (known != per_host_.end() && known->second >= max_per_host_) {
    // Fair within the address: a client is never locked out by idle connections from its own
    // address (NAT, a shared host), only delayed by one eviction. Idle ones go first; none younger
    // than kEvictGrace.
    auto victim = conns_.end();
    auto old = Clock::now() - kEvictGrace;
    for (auto it = conns_.begin(); it != conns_.end(); ++it) {
      if (it->host != host || it->since > old) continue;
      if (victim == conns_.end()) victim = it;
      if (!it->spoke()) {
        victim = it;
        break;
      }
    }
    if (victim == conns_.end()) {
      DMX_LOG_LIMITED(log_, warn, "per-address", "listener {}: {} holds {} unauthenticated connections "
                      "(max_pending_per_address), all younger than {} ms; refusing its new one", address_, host,
                      known->second, kEvictGrace.count());
      return false;
    }
    {
      DMX_LOG_LIMITED(log_, warn, "per-address", "listener {}: {} holds {} unauthenticated connections "
                      "(max_pending_per_address); evicting its oldest{}, {}, for {}", address_, host, known->second,
                      victim->spoke() ? "" : " idle one", victim->peer, newcomer);
      tell(*victim, Status(Code::kResourceExhausted,
                           fmt::format("the server refused address {}: it holds {} connections in their handshake "
                                       "(max_pending_per_address); this one, the oldest{}, was evicted for a new one",
                                       host, known->second, victim->spoke() ? "" : " idle one")));
      drop_conn(victim);
    }
  }
  if (conns_.size() >= max_pending_) {
    // Full: the oldest gives way. A flood of idle connections then only delays a good client by
    // how fast the flood connects, never locks it out.
    DMX_LOG_LIMITED(log_, warn, "evict", "listener {}: {} handshakes pending (max_pending_handshakes); "
                    "evicting the oldest, {}, for {}", address_, conns_.size(), conns_.front().peer, newcomer);
    tell(conns_.front(), Status(Code::kResourceExhausted,
                                fmt::format("the server holds {} connections in their handshake "
                                            "(max_pending_handshakes); this one, the oldest, was evicted for a new one",
                                            conns_.size())));
    drop_conn(conns_.begin());
  }
  return true;
}

Status ListenerImpl::endpoint_room(const std::string& key, bool dry_run) {
  // Endpoints still being built on set-up threads count too: max_endpoints holds as it did when
  // they were built on this thread.
  int live = ctx_->live_endpoints() + building_.load(std::memory_order_acquire);
  if (live < ctx_->params().max_endpoints) return Status();
  std::string full =
      fmt::format("{} endpoints are open or being set up, the most this context holds (max_endpoints)", live);
  Status s = ctx_->evict_idle_endpoint(key, full, dry_run);
  if (s.ok() && !dry_run)
    DMX_LOG_LIMITED(log_, warn, "evict-endpoint", "listener {}: {}; evicted an idle endpoint of the peer that holds "
                    "the most for peer {}", address_, full, key);
  return s;
}

Status ListenerImpl::check_peer_cap(const std::string& key) const {
  int held = ctx_->peer_endpoints(key);
  for (const auto& [id, p] : pending_) held += p.authed && p.key == key ? 1 : 0;
  for (const auto& st : setups_) held += st.key == key && st.active() ? 1 : 0;
  if (held < ctx_->params().max_endpoints_per_peer) return Status();
  return Status(Code::kResourceExhausted,
                fmt::format("the server refused peer {}: it holds {} endpoints here (open or being set up), the most "
                            "one peer may (max_endpoints_per_peer)",
                            key, held));
}

std::list<ListenerImpl::Conn>::iterator ListenerImpl::drop_conn(std::list<Conn>::iterator it) {
  auto h = per_host_.find(it->host);
  if (h != per_host_.end() && --h->second == 0) per_host_.erase(h);
  if (it->awaiting_auth != 0) {  // its session can never authenticate now
    auto p = pending_.find(it->awaiting_auth);
    if (p != pending_.end() && !p->second.authed) pending_.erase(p);
  }
  return conns_.erase(it);
}

void ListenerImpl::accept_new() {
  for (;;) {
    int raw = ::accept4(fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (raw < 0) {
      int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        accept_paused_until_ = Clock::now() + kAcceptPause;
        DMX_LOG_LIMITED(log_, warn, "accept", "listener {}: {}; not accepting for {} ms", address_,
                        errno_status("accept", err).message(), kAcceptPause.count());
        return;
      }
      // A connection that died in the queue (ECONNABORTED and the like): the next one may be fine.
      DMX_LOG_LIMITED(log_, warn, "accept-other", "listener {}: {}", address_, errno_status("accept", err).message());
      if (err == ECONNABORTED || err == EPROTO || err == EPERM) continue;
      accept_paused_until_ = Clock::now() + kAcceptPause;
      return;
    }
    UniqueFd fd(raw);
    std::string peer = stream::peer_name(raw);
    std::string host = host_of(peer);
    if (!make_room(host, peer)) {
      Conn refused;
      refused.fd = std::move(fd);
      refused.peer = peer;
      tell(refused, Status(Code::kResourceExhausted,
                           fmt::format("the server refused address {}: it holds {} connections in their handshake "
                                       "(max_pending_per_address), all opened in the last {} ms",
                                       host, per_host_[host], kEvictGrace.count())));
      continue;
    }
    const EngineParams& p = ctx_->params();
    stream::StreamOptions so;
    so.socket_buffer = p.socket_buffer;
    so.user_timeout_ms = stream::user_timeout_ms(p.peer_timeout);
    if (Status s = stream::configure_stream(raw, so); !s.ok()) {
      DMX_LOG_LIMITED(log_, warn, "configure", "listener {}: peer {}: {}", address_, peer, s.message());
      continue;
    }
    Conn c;
    c.fd = std::move(fd);
    c.peer = peer;
    c.host = host;
    ++per_host_[host];
    c.deadline = Deadline::after(p.handshake_timeout);
    c.since = Clock::now();
    conns_.push_back(std::move(c));
  }
}

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

// --- handles ---

Result<Listener> Context::listen(const std::string& address) {
  DMX_ASSIGN_OR_RETURN(auto impl, ListenerImpl::create(impl_, address));
  // With store_name set, the first listener registers this process under it (docs/cluster.md).
  if (Status s = impl_->announce(impl->address()); !s.ok()) {
    impl->close();
    return Status(s.code(), fmt::format("listen({}): registering store_name: {}", address, s.message()));
  }
  return Listener(std::move(impl));
}

Listener::Listener(std::shared_ptr<ListenerImpl> impl) : impl_(std::move(impl)) {}
Listener::~Listener() {
  if (impl_) impl_->close();
}
Listener& Listener::operator=(Listener&& o) noexcept {
  if (this != &o) {
    if (impl_) impl_->close();
    impl_ = std::move(o.impl_);
  }
  return *this;
}
Result<Endpoint> Listener::accept(Duration timeout) {
  if (!impl_) return Status(Code::kInvalidArgument, "accept on an empty Listener");
  return impl_->accept(timeout);
}
std::string Listener::address() const { return impl_ ? impl_->address() : std::string(); }
void Listener::close() {
  if (impl_) impl_->close();
}

}  // namespace dmx
