// Listener: accepts connections and runs the server side of the handshake as a non-blocking
// state machine on one thread, each connection with its own deadline — so a peer that connects
// and says nothing, or says garbage, delays nobody else. Pre-auth connections are bounded in all
// (max_pending_handshakes) and per address (max_pending_per_address); at either cap the oldest
// (of that address, one that has sent nothing first) is evicted for the new one and told why in a
// REJECT. Authenticated peers (address + process) are bounded by max_endpoints_per_peer below
// max_endpoints; endpoint set-ups by kMaxSetups, the oldest evicted for a new one. When the
// process is out of fds, accepting pauses for kAcceptPause instead of spinning. Every line a peer
// can cause goes through log_ (one per kind per second). The handshake's frames: listener_handshake.cc.
#include <fmt/format.h>
#include <poll.h>
#include <sys/eventfd.h>

#include <algorithm>

#include "engine/listener_impl.h"
#include "stream/socket.h"

namespace dmx {
namespace {
// Out of fds (EMFILE/ENFILE), accept would fail at once and the listen socket stay readable: rest it
// this long rather than spin on it. Handshakes in progress keep going meanwhile.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
// At max_pending_per_address, connections younger than this are not evicted: a client sends its
// HELLO within a round trip, and a flood that reopens each evicted connection at once would
// otherwise evict it before it could.
constexpr auto kEvictGrace = std::chrono::milliseconds(250);

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
