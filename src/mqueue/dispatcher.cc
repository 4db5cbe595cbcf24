#include "mqueue/dispatcher.h"

#include <sys/epoll.h>
#include <time.h>

#include <cstdio>
#include <cstring>

#include "mqueue/dispatcher_impl.h"

namespace dmx::mqueue {

Result<std::unique_ptr<Dispatcher>> Dispatcher::start(QueueSet* queues, DispatcherConfig config) {
  auto impl = std::make_unique<Impl>();
  Impl& d = *impl;
  d.q = queues;
  d.cfg = std::move(config);
  const Geometry& g = queues->layout().g;
  d.batch = d.cfg.credit_batch ? std::min(d.cfg.credit_batch, g.slots) : std::max(1u, g.slots / 2);
  d.workers.resize(g.workers);
  d.meta.resize(size_t{g.workers} * g.slots);
  d.ep = Fd(::epoll_create1(EPOLL_CLOEXEC));
  if (!d.ep.valid()) return Status(Code::kIo, std::string("epoll_create1 failed: ") + std::strerror(errno));
  if (d.cfg.udp.empty() && d.cfg.tcp.empty() && d.cfg.dmx.empty())
    return Status(Code::kInvalidArgument, "dispatcher: no UDP, TCP or dmx address");
  if (!d.cfg.udp.empty()) {
    DMX_ASSIGN_OR_RETURN(SockAddr a, resolve(d.cfg.udp));
    DMX_ASSIGN_OR_RETURN(d.udp, udp_bind(a));
    DMX_RETURN_IF_ERROR(set_nonblocking(d.udp.get()));
    DMX_ASSIGN_OR_RETURN(d.udp_addr, local_address(d.udp.get()));
    d.watch(d.udp.get(), FdKind::kUdp, 0, EPOLLIN);
  }
  if (!d.cfg.tcp.empty()) {
    DMX_ASSIGN_OR_RETURN(SockAddr a, resolve(d.cfg.tcp));
    DMX_ASSIGN_OR_RETURN(d.listen, tcp_listen(a));
    DMX_RETURN_IF_ERROR(set_nonblocking(d.listen.get()));
    DMX_ASSIGN_OR_RETURN(d.tcp_addr, local_address(d.listen.get()));
    d.accept_errors = AcceptErrors("tcp " + d.tcp_addr.to_string(), &d.log);
    d.watch(d.listen.get(), FdKind::kListen, 0, EPOLLIN);
  }
  DMX_RETURN_IF_ERROR(d.connect_services());
  if (Status st = d.start_dmx(); !st.ok()) {
    d.stop_dmx();
    return st;
  }
  d.thread = std::thread(&Impl::run, &d);
  return std::unique_ptr<Dispatcher>(new Dispatcher(std::move(impl)));
}

Dispatcher::Dispatcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Dispatcher::~Dispatcher() { (void)stop(); }

std::string Dispatcher::udp_address() const { return impl_->udp.valid() ? impl_->udp_addr.to_string() : ""; }
std::string Dispatcher::tcp_address() const { return impl_->listen.valid() ? impl_->tcp_addr.to_string() : ""; }
std::string Dispatcher::dmx_address() const { return impl_->dmx_addr; }

DispatcherStats Dispatcher::stats() const {
  std::lock_guard<std::mutex> lock(impl_->stats_mu);
  return impl_->stats;
}

Status Dispatcher::stop() {
  impl_->stop.store(true);
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->stop_dmx();
  return impl_->failure;
}

void Dispatcher::Impl::watch(int fd, FdKind kind, uint32_t index, uint32_t events, bool modify) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = (uint64_t{static_cast<uint32_t>(kind)} << 32) | index;
  (void)::epoll_ctl(ep.get(), modify ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev);
}

void Dispatcher::Impl::event(const std::string& text) {
  if (cfg.on_event) {
    cfg.on_event(text);
  } else {
    std::fprintf(stderr, "dmx mqueue: %s\n", text.c_str());
  }
}

void Dispatcher::Impl::count(uint64_t DispatcherStats::*field, uint64_t n) {
  std::lock_guard<std::mutex> lock(stats_mu);
  stats.*field += n;
}

bool Dispatcher::Impl::in_flight() const {
  for (const WorkerState& w : workers)
    if (w.issued != w.collected || w.replied != w.calls_taken) return true;
  return false;
}

void Dispatcher::Impl::run() {
  epoll_event evs[64];
  while (!stop.load(std::memory_order_relaxed) && failure.ok()) {
    bool busy = collect_responses();
    busy |= forward_calls();
    if (!blocked.empty()) retry_blocked();
    if (!dmx_blocked.empty()) retry_dmx_blocked();
    if (!rings.empty()) refill_rings();
    // Busy-poll while anything is in flight (a response can land any moment); sleep otherwise.
    // A poll round that found nothing yields, so that workers sharing our core can run.
    const bool waiting = !busy && in_flight();
    int n = ::epoll_wait(ep.get(), evs, 64, busy || waiting ? 0 : 5);
    if (n == 0 && waiting) std::this_thread::yield();
    for (int i = 0; i < n; ++i) {
      auto kind = static_cast<FdKind>(evs[i].data.u64 >> 32);
      auto index = static_cast<uint32_t>(evs[i].data.u64);
      switch (kind) {
        case FdKind::kUdp: on_udp(); break;
        case FdKind::kListen: on_accept(); break;
        case FdKind::kConn: on_conn(index, evs[i].events); break;
        case FdKind::kService: on_service(index, evs[i].events); break;
        case FdKind::kDmx: busy |= on_dmx(); break;
      }
    }
    if (udp_blocked) on_udp();
    if (accept_paused && std::chrono::steady_clock::now() >= accept_paused_until) {
      accept_paused = false;
      watch(listen.get(), FdKind::kListen, 0, EPOLLIN, true);
    }
    if (!conns.empty() || !peers.empty()) drop_stalled();
  }
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  std::lock_guard<std::mutex> lock(stats_mu);
  stats.cpu_seconds = static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

int Dispatcher::Impl::pick_worker() {
  const uint32_t nw = local_workers, slots = q->layout().g.slots;  // remote rings take no others' requests
  if (nw == 0) return -1;
  int best = -1;
  uint32_t best_load = slots;
  for (uint32_t i = 0; i < nw; ++i) {
    uint32_t w = (rr + i) % nw;
    uint32_t load = workers[w].issued - workers[w].collected;
    if (load >= slots) continue;  // no credit: its ring is full
    if (cfg.policy == Policy::kRoundRobin) {
      best = static_cast<int>(w);
      break;
    }
    if (load < best_load) {  // least loaded; ties go to the next in round-robin order
      best = static_cast<int>(w);
      best_load = load;
    }
  }
  if (best >= 0) rr = (static_cast<uint32_t>(best) + 1) % nw;
  return best;
}

bool Dispatcher::Impl::post(uint32_t w, uint32_t len, const SlotMeta& m) {
  const Layout& l = q->layout();
  WorkerState& ws = workers[w];
  const uint32_t seq = ws.issued, s = seq & (l.g.slots - 1);
  const uint64_t off = l.rx_slot(w, s);
  SlotHeader h{len, 0};
  std::memcpy(q->staging_for(off), &h, sizeof h);
  Status st = q->publish_staged(off, sizeof h + len);             // payload first,
  if (st.ok()) st = q->store_worker_word(l.rx_flag(w, s), seq + 1);  // flag last
  if (!st.ok()) {
    failure = st;
    event("writing a request into worker memory failed: " + st.to_string());
    return false;
  }
  meta[size_t{w} * l.g.slots + s] = m;
  ws.issued++;
  std::lock_guard<std::mutex> lock(stats_mu);
  stats.requests++;
  stats.max_occupancy = std::max(stats.max_occupancy, ws.issued - ws.collected);
  return true;
}

void Dispatcher::Impl::flush_credits(uint32_t w) {
  WorkerState& ws = workers[w];
  if (ws.credited == ws.collected) return;
  Status st = q->store_worker_word(q->layout().ctl_of(w) + offsetof(WorkerCtl, tx_credit), ws.collected);
  if (!st.ok()) {
    failure = st;
    event("writing credits into worker memory failed: " + st.to_string());
    return;
  }
  ws.credited = ws.collected;
  count(&DispatcherStats::credit_writes);
}

bool Dispatcher::Impl::collect_responses() {
  const Layout& l = q->layout();
  const uint8_t* rmem = q->response_base();
  bool any = false;
  for (uint32_t w = 0; w < workers.size(); ++w) {
    WorkerState& ws = workers[w];
    while (ws.collected != ws.issued) {
      const uint32_t seq = ws.collected, s = seq & (l.g.slots - 1);
      if (q->load_response_word(l.tx_flag(w, s)) != seq + 1) break;
      SlotHeader h;
      std::memcpy(&h, rmem + l.tx_slot(w, s), sizeof h);
      // A worker's length is not trusted either (a GPU bug must not read past the slot).
      uint32_t len = std::min(h.len, l.g.max_response);
      send_response(meta[size_t{w} * l.g.slots + s], h.status, rmem + l.tx_slot(w, s) + sizeof h, len);
      ws.collected++;
      any = true;
      // Batched. A worker waiting for a credit (answer seq with seq - credited >= N) has answered
      // everything before seq; once those are collected, collected - credited >= N >= batch.
      if (ws.collected - ws.credited >= batch) flush_credits(w);
    }
  }
  return any;
}

}  // namespace dmx::mqueue
