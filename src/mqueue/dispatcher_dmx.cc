// The dmx face of the dispatcher: clients that are dmx endpoints, accepted by a dmx Listener (so
// authenticated, capped in all and per peer, with the listener's accept back-off), and the Remote
// MQueue Manager, which lends a worker's ring to one client for one-sided writes.
//
// dmx threads never touch the dispatcher's state: completions, notifications and accepted
// endpoints go through the DmxInbox to the dispatcher thread. Closing an endpoint and withdrawing
// a registration wait for dmx, so they run on the Closer's thread.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "mqueue/dispatcher_impl.h"
#include "mqueue/request_header.h"

namespace dmx::mqueue {
namespace {

constexpr auto kAcceptStep = std::chrono::milliseconds(50);  // how soon the acceptor sees stop

std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

}  // namespace

Status DmxInbox::open() {
  wake_ = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_.valid()) return Status(Code::kIo, std::string("eventfd failed: ") + std::strerror(errno));
  return Status();
}

void DmxInbox::push(DmxEvent e) {
  bool was_empty;
  {
    std::lock_guard<std::mutex> lock(mu_);
    was_empty = events_.empty();
    events_.push_back(std::move(e));
  }
  if (was_empty) {
    uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof one);
  }
}

std::vector<DmxEvent> DmxInbox::take() {
  uint64_t n;
  (void)!::read(wake_.get(), &n, sizeof n);
  std::vector<DmxEvent> out;
  std::lock_guard<std::mutex> lock(mu_);
  out.swap(events_);
  return out;
}

Closer::Closer() : thread_(&Closer::loop, this) {}

Closer::~Closer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Closer::run(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_all();
}

void Closer::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return quit_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // quit_ and nothing left
    auto job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    lock.lock();
  }
}

Status Dispatcher::Impl::start_dmx() {
  const uint32_t nw = q->layout().g.workers;
  if (cfg.remote_queues >= nw && (!cfg.udp.empty() || !cfg.tcp.empty()))
    return Status(Code::kInvalidArgument, "dispatcher: remote_queues " + std::to_string(cfg.remote_queues) +
                                              " leaves none of the " + std::to_string(nw) +
                                              " workers for the UDP and TCP faces");
  if (cfg.remote_queues > nw)
    return Status(Code::kInvalidArgument, "dispatcher: remote_queues " + std::to_string(cfg.remote_queues) + " over " +
                                              std::to_string(nw) + " workers");
  local_workers = nw - cfg.remote_queues;
  rings.resize(cfg.remote_queues);
  if (cfg.dmx.empty()) {
    if (cfg.remote_queues) return Status(Code::kInvalidArgument, "dispatcher: remote_queues without a dmx address");
    return Status();
  }
  Options o = cfg.dmx_options;
  o.set_default("max_endpoints", std::to_string(cfg.max_connections), "mqueue max_connections");
  o.set_default("max_endpoints_per_peer", std::to_string(cfg.max_per_address), "mqueue max_per_address");
  DMX_ASSIGN_OR_RETURN(Context c, Context::create(o));
  ctx = std::make_unique<Context>(std::move(c));
  DMX_ASSIGN_OR_RETURN(Listener l, ctx->listen(cfg.dmx));
  dmx_listener = std::make_unique<Listener>(std::move(l));
  dmx_addr = dmx_listener->address();
  inbox = std::make_shared<DmxInbox>();
  DMX_RETURN_IF_ERROR(inbox->open());
  watch(inbox->fd(), FdKind::kDmx, 0, EPOLLIN);
  closer = std::make_unique<Closer>();
  acceptor = std::thread(&Impl::accept_dmx, this);
  return Status();
}

void Dispatcher::Impl::accept_dmx() {
  while (accepting.load()) {
    Result<Endpoint> ep = dmx_listener->accept(kAcceptStep);
    if (ep.ok()) {
      DmxEvent e;
      e.kind = DmxEvent::Kind::kAccepted;
      e.ep = std::make_shared<Endpoint>(std::move(*ep));
      inbox->push(std::move(e));
    } else if (ep.status().code() != Code::kTimeout) {
      // The listener says what went wrong (and rests on its own when out of fds); do not spin.
      log.emit("dmx-accept", "accept(" + dmx_addr + ") failed: " + ep.status().to_string());
      std::this_thread::sleep_for(kAcceptStep);
    }
  }
}

// After the dispatcher thread has ended: nothing posts any more; every endpoint is closed and every
// registration withdrawn before the memory they use (the queues, the peers' buffers) can go.
void Dispatcher::Impl::stop_dmx() {
  if (!ctx || !closer) return;
  accepting.store(false);
  if (acceptor.joinable()) acceptor.join();
  dmx_listener->close();
  for (DmxEvent& e : inbox->take())
    if (e.ep) closer->run([ep = std::move(e.ep)] { (void)ep->close(); });
  for (DmxPeer& p : peers) {
    if (!p.ep) continue;
    closer->run([ep = std::move(p.ep), rx = std::move(p.rx), reg = std::move(p.reg)] {
      (void)ep->close();
      if (reg) (void)reg->deregister();
    });
  }
  closer.reset();  // runs every job, then joins
}

bool Dispatcher::Impl::on_dmx() {
  std::vector<DmxEvent> evs = inbox->take();
  for (DmxEvent& e : evs) {
    switch (e.kind) {
      case DmxEvent::Kind::kAccepted:
        on_dmx_accepted(std::move(e.ep));
        break;
      case DmxEvent::Kind::kReceived:
        // An event of an earlier client at this index (its receive ended by our close) is not this one's.
        if (e.peer < peers.size() && peers[e.peer].gen == e.gen) on_dmx_received(e.peer, e.status, e.bytes);
        break;
      case DmxEvent::Kind::kNotified:
        if (e.peer < peers.size() && peers[e.peer].open && peers[e.peer].gen == e.gen && peers[e.peer].pending_notes)
          peers[e.peer].pending_notes->fetch_sub(1, std::memory_order_relaxed);
        if (!e.status.ok()) {
          if (e.peer < peers.size() && peers[e.peer].open && peers[e.peer].gen == e.gen)
            drop_dmx(e.peer, "sent notifications faster than they are checked (" + e.status.message() + " unchecked)");
          break;
        }
        if (e.peer < peers.size() && peers[e.peer].gen == e.gen) on_dmx_notified(e.peer, e.note);
        break;
      case DmxEvent::Kind::kSent:
        if (e.peer < peers.size() && peers[e.peer].open && peers[e.peer].gen == e.gen) {
          DmxPeer& p = peers[e.peer];
          p.out_bytes -= std::min(p.out_bytes, e.bytes);
          if (!e.status.ok() && e.status.code() != Code::kClosed)
            drop_dmx(e.peer, "an answer failed: " + e.status.to_string());
          else if (p.ready)
            advance_dmx(e.peer);  // its backlog may have gone below the limit
        }
        break;
      case DmxEvent::Kind::kRingReleased:
        if (e.peer < rings.size()) rings[e.peer].state = RemoteRing::State::kDraining;
        break;
    }
  }
  return !evs.empty();
}

void Dispatcher::Impl::on_dmx_accepted(std::shared_ptr<Endpoint> ep) {
  uint32_t id = 0;
  while (id < peers.size() && (peers[id].open || peers[id].ep)) ++id;
  if (id == peers.size()) peers.emplace_back();
  DmxPeer& p = peers[id];
  const uint32_t gen = p.gen + 1;
  p = DmxPeer{};
  p.gen = gen;
  p.ep = std::move(ep);
  p.name = "dmx client " + p.ep->peer();
  auto rx = Buffer::allocate(MemSpec{MemKind::kHost, 0}, sizeof(WireHeader) + q->layout().g.max_request);
  if (!rx.ok()) {
    log.emit("drop", "dropped " + p.name + ": " + rx.status().to_string());
    closer->run([ep = std::move(p.ep)] { (void)ep->close(); });
    return;
  }
  p.rx = std::make_shared<Buffer>(std::move(*rx));
  p.open = true;
  p.last_active = std::chrono::steady_clock::now();
  count(&DispatcherStats::dmx_clients);
  post_dmx_recv(id);
}

void Dispatcher::Impl::post_dmx_recv(uint32_t id) {
  DmxPeer& p = peers[id];
  OpOptions o;
  o.on_complete = [inbox = inbox, id, gen = p.gen](const Status& st, size_t n) {
    DmxEvent e;
    e.kind = DmxEvent::Kind::kReceived;
    e.peer = id;
    e.gen = gen;
    e.status = st;
    e.bytes = n;
    inbox->push(std::move(e));
  };
  (void)p.ep->recv(p.rx->region(), kAnyTag, std::move(o));
}

void Dispatcher::Impl::on_dmx_received(uint32_t id, const Status& st, size_t bytes) {
  if (id >= peers.size() || !peers[id].open) return;
  DmxPeer& p = peers[id];
  if (!st.ok()) {
    if (st.code() == Code::kClosed) return drop_dmx(id, "");  // an orderly goodbye
    if (st.code() == Code::kTruncated)
      return drop_dmx(id, "a message over " + std::to_string(sizeof(WireHeader) + q->layout().g.max_request) +
                              " bytes (max_request " + std::to_string(q->layout().g.max_request) + ")");
    return drop_dmx(id, st.to_string());
  }
  p.last_active = std::chrono::steady_clock::now();
  if (p.mode == DmxPeer::Mode::kRemote)
    return drop_dmx(id, "sent a message while holding remote queue " + std::to_string(p.ring) +
                            " (only writes with notifications go there)");
  const auto* b = static_cast<const uint8_t*>(p.rx->data());
  WireHeader h{};
  std::memcpy(&h, b, std::min(bytes, sizeof h));
  if (bytes == sizeof h && h.magic == kQueueMagic && h.len == 0) return grant_ring(id);
  CheckedHeader ch = check_request_header(b, std::min(bytes, sizeof h), q->layout().g.max_request,
                                          Framing{true, static_cast<uint64_t>(bytes), false});
  if (!ch.ok()) return drop_dmx(id, ch.why);
  p.ready = true;
  p.ready_bytes = bytes;
  advance_dmx(id);
}

bool Dispatcher::Impl::advance_dmx(uint32_t id) {
  DmxPeer& p = peers[id];
  if (!p.open || !p.ready) return true;
  if (p.out_bytes > cfg.max_tcp_backlog) return true;  // let it take its answers first (kSent retries)
  int w = pick_worker();
  if (w < 0) {
    bool listed = false;
    for (uint32_t b : dmx_blocked) listed |= b == id;
    if (!listed) {
      dmx_blocked.push_back(id);
      count(&DispatcherStats::backpressure);
    }
    return false;
  }
  const Layout& l = q->layout();
  WireHeader h;
  std::memcpy(&h, p.rx->data(), sizeof h);
  uint8_t* slot = q->staging_for(l.rx_slot(w, workers[w].issued & (l.g.slots - 1)));
  // The one copy of this face: a recv cannot be posted into a slot ahead of time, since the ring
  // takes requests in order and an idle client would hold its slot.
  if (h.len) std::memcpy(slot + sizeof(SlotHeader), static_cast<const uint8_t*>(p.rx->data()) + sizeof h, h.len);
  SlotMeta m;
  m.from = SlotMeta::From::kDmx;
  m.conn = id;
  m.gen = p.gen;
  m.tag = h.tag;
  p.ready = false;
  if (!post(static_cast<uint32_t>(w), h.len, m)) return false;
  p.in_flight++;
  post_dmx_recv(id);
  return true;
}

void Dispatcher::Impl::retry_dmx_blocked() {
  std::vector<uint32_t> ids;
  ids.swap(dmx_blocked);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!dmx_blocked.empty()) {  // full again: keep the rest in order
      for (size_t k = i; k < ids.size(); ++k) dmx_blocked.push_back(ids[k]);
      return;
    }
    if (ids[i] < peers.size() && peers[ids[i]].open) advance_dmx(ids[i]);
  }
}

// The Remote MQueue Manager: lends a free remote ring to the peer, registers the ring's slots for it
// alone (a fresh key, withdrawn when it goes), and from then on takes its notifications.
void Dispatcher::Impl::grant_ring(uint32_t id) {
  DmxPeer& p = peers[id];
  const Layout& l = q->layout();
  auto refuse = [&](const std::string& why) {
    log.emit("remote", "refused a remote queue to " + p.name + ": " + why);
    send_dmx(id, kErrorMagic, 0, why.data(), static_cast<uint32_t>(why.size()), false);
    post_dmx_recv(id);
  };
  if (rings.empty()) return refuse("no remote queues here (remote_queues 0)");
  if (p.in_flight) return refuse("it has requests in flight");
  uint32_t r = 0;
  while (r < rings.size() && rings[r].state != RemoteRing::State::kFree) ++r;
  if (r == rings.size()) return refuse("all " + std::to_string(rings.size()) + " remote queues are lent");
  const uint32_t w = local_workers + r;
  const uint64_t off = l.rx_slot(w, 0), size = uint64_t{l.g.slots} * l.rx_slot_bytes;
  MemRegion ring{q->worker_base() + off, static_cast<size_t>(size), q->worker_where()};
  auto reg = ctx->register_memory(ring);
  if (!reg.ok()) return refuse("registering its ring failed: " + reg.status().to_string());
  p.reg = std::make_shared<Registration>(std::move(*reg));
  RemoteRegion rr = p.reg->remote();
  p.key = rr.key;
  p.mode = DmxPeer::Mode::kRemote;
  p.ring = r;
  p.base_seq = workers[w].issued;
  p.next_index = 0;
  rings[r] = RemoteRing{RemoteRing::State::kLent, id};
  count_lent();
  // A client that notifies faster than the dispatcher checks cannot grow the inbox without bound:
  // beyond `limit` unchecked notifications the rest are not queued, and the client is closed.
  p.pending_notes = std::make_shared<std::atomic<uint32_t>>(0);
  const uint32_t limit = 2 * l.g.slots + 16;
  p.ep->on_notification([inbox = inbox, id, gen = p.gen, pending = p.pending_notes, limit](const Notification& n) {
    DmxEvent e;
    e.kind = DmxEvent::Kind::kNotified;
    e.peer = id;
    e.gen = gen;
    e.note = n;
    const uint32_t before = pending->fetch_add(1, std::memory_order_relaxed);
    if (before > limit) return;  // the one at `limit` + 1 below tells the dispatcher
    if (before == limit)
      e.status = Status(Code::kResourceExhausted, "over " + std::to_string(limit) + " notifications");
    inbox->push(std::move(e));
  });
  QueueGrant g{};
  std::vector<unsigned char> key = rr.serialize();
  std::memcpy(g.region, key.data(), std::min(key.size(), sizeof g.region));
  g.slots = l.g.slots;
  g.slot_bytes = l.rx_slot_bytes;
  g.first_slot = p.base_seq & (l.g.slots - 1);
  g.max_request = l.g.max_request;
  g.max_response = l.g.max_response;
  g.queue = w;
  count(&DispatcherStats::remote_granted);
  send_dmx(id, kQueueMagic, 0, &g, sizeof g, false);
  post_dmx_recv(id);  // only to see it go (or break the rules)
}

// A remote client's write of request `index` landed: check it against what the client owns, then
// hand the slot to the worker by its flag (the payload is there: dmx notifies after landing).
void Dispatcher::Impl::on_dmx_notified(uint32_t id, const Notification& n) {
  if (id >= peers.size() || !peers[id].open || peers[id].mode != DmxPeer::Mode::kRemote) return;
  DmxPeer& p = peers[id];
  const Layout& l = q->layout();
  const uint32_t w = local_workers + p.ring;
  WorkerState& ws = workers[w];
  const std::string queue = "remote queue " + std::to_string(p.ring) + " (worker " + std::to_string(w) + ")";
  if (n.key != p.key)
    return drop_dmx(id, "notified a write into key " + hex(n.key) + ", not its " + queue + " (key " + hex(p.key) + ")");
  if (n.length < sizeof(SlotHeader) || n.length > sizeof(SlotHeader) + uint64_t{l.g.max_request})
    return drop_dmx(id, "bad write of " + std::to_string(n.length) + " bytes for index " + std::to_string(n.value) +
                            " in " + queue + " (a request is 8 to " + std::to_string(8 + l.g.max_request) + ")");
  if (n.value != p.next_index)
    return drop_dmx(
        id, "bad index " + std::to_string(n.value) + " in " + queue + ": expected " + std::to_string(p.next_index));
  const uint32_t seq = p.base_seq + p.next_index;
  if (seq - ws.collected >= l.g.slots)
    return drop_dmx(id, "bad index " + std::to_string(n.value) + " in " + queue + ": its " + std::to_string(l.g.slots) +
                            " slots are full (index " + std::to_string(ws.collected - p.base_seq) +
                            " is the oldest unanswered)");
  const uint32_t s = seq & (l.g.slots - 1);
  if (Status st = q->store_worker_word(l.rx_flag(w, s), seq + 1); !st.ok()) {
    failure = st;
    event("writing a flag into worker memory failed: " + st.to_string());
    return;
  }
  SlotMeta m;
  m.from = SlotMeta::From::kDmx;
  m.conn = id;
  m.gen = p.gen;
  m.tag = p.next_index;
  meta[size_t{w} * l.g.slots + s] = m;
  ws.issued++;
  p.next_index++;
  p.in_flight++;
  p.last_active = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(stats_mu);
  stats.requests++;
  stats.remote_requests++;
  stats.max_occupancy = std::max(stats.max_occupancy, ws.issued - ws.collected);
}

void Dispatcher::Impl::send_dmx(uint32_t id, uint32_t magic, uint64_t tag, const void* payload, uint32_t len,
                                bool answer) {
  if (id >= peers.size() || !peers[id].open) {
    if (answer) count(&DispatcherStats::responses_discarded);
    return;
  }
  DmxPeer& p = peers[id];
  if (answer && p.in_flight > 0) p.in_flight--;
  p.last_active = std::chrono::steady_clock::now();
  auto buf = std::make_shared<std::vector<uint8_t>>(sizeof(WireHeader) + len);
  WireHeader h{magic, len, tag};
  std::memcpy(buf->data(), &h, sizeof h);
  if (len) std::memcpy(buf->data() + sizeof h, payload, len);
  p.out_bytes += buf->size();
  OpOptions o;
  o.on_complete = [inbox = inbox, id, gen = p.gen, buf](const Status& st, size_t) {
    DmxEvent e;
    e.kind = DmxEvent::Kind::kSent;
    e.peer = id;
    e.gen = gen;
    e.status = st;
    e.bytes = buf->size();
    inbox->push(std::move(e));
  };
  (void)p.ep->send(MemRegion{buf->data(), buf->size()}, tag, std::move(o));
}

void Dispatcher::Impl::drop_dmx(uint32_t id, const std::string& why) {
  DmxPeer& p = peers[id];
  if (!p.open) return;
  if (!why.empty()) {
    count(&DispatcherStats::dropped_clients);
    log.emit("drop", "dropped " + p.name + ": " + why);
  }
  p.open = false;
  p.ready = false;
  const bool remote = p.mode == DmxPeer::Mode::kRemote;
  const uint32_t r = p.ring;
  if (remote) rings[r].state = RemoteRing::State::kReleasing;
  // Its answers still in the queues are discarded when they come (open is false, or gen differs).
  // The endpoint closes before the registration is withdrawn: no write of its lands after that.
  closer->run([ep = std::move(p.ep), rx = std::move(p.rx), reg = std::move(p.reg), inbox = inbox, remote, r] {
    (void)ep->close();
    if (reg) (void)reg->deregister();
    if (remote) {
      DmxEvent e;
      e.kind = DmxEvent::Kind::kRingReleased;
      e.peer = r;
      inbox->push(std::move(e));
    }
  });
}

void Dispatcher::Impl::refill_rings() {
  for (uint32_t r = 0; r < rings.size(); ++r) {
    const WorkerState& ws = workers[local_workers + r];
    if (rings[r].state == RemoteRing::State::kDraining && ws.collected == ws.issued) {
      rings[r].state = RemoteRing::State::kFree;
      count_lent();
    }
  }
}

void Dispatcher::Impl::count_lent() {
  uint32_t n = 0;
  for (const RemoteRing& r : rings) n += r.state != RemoteRing::State::kFree;
  std::lock_guard<std::mutex> lock(stats_mu);
  stats.remote_lent = n;
}

void Dispatcher::Impl::sweep_dmx(std::chrono::steady_clock::time_point now) {
  for (uint32_t id = 0; id < peers.size(); ++id) {
    DmxPeer& p = peers[id];
    if (!p.open || p.ready || p.in_flight || p.out_bytes || now - p.last_active <= cfg.idle_timeout) continue;
    count(&DispatcherStats::idle_closed);
    log.emit("idle",
             "closed " + p.name + ": sent nothing for " +
                 std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(cfg.idle_timeout).count()) +
                 " ms (idle_timeout)");
    drop_dmx(id, "");
  }
}

}  // namespace dmx::mqueue
