// Endpoint: creation, failure, close, statistics and completion delivery.
#include <fmt/format.h>

#include <bit>
#include <cassert>

#include "core/crc32c.h"
#include "core/log.h"
#include "core/reaper.h"
#include "core/trace.h"
#include "core/units.h"
#include "engine/endpoint/endpoint_impl.h"
#include "engine/endpoint/internal.h"

namespace dmx {

using wire::FrameHeader;
using wire::FrameType;
using namespace endpoint;

std::shared_ptr<EndpointImpl> EndpointImpl::create(std::shared_ptr<ContextImpl> ctx, Session session,
                                                   std::vector<std::unique_ptr<stream::Conduit>> conduits,
                                                   std::vector<std::unique_ptr<PayloadPath>> paths) {
  auto ep = std::shared_ptr<EndpointImpl>(new EndpointImpl(std::move(ctx), std::move(session)));
  ep->paths_.resize(paths.size());
  for (size_t k = 0; k < paths.size(); ++k) {
    PathState& ps = ep->paths_[k];
    ps.id = static_cast<uint8_t>(k + 1);
    ps.events = ep->events_for(ps.id);
    ps.path = std::move(paths[k]);
    ep->has_paths_ = ep->has_paths_ || ps.path != nullptr;
  }
  const EngineParams& p = ep->params_;
  ep->streams_.reserve(conduits.size() + (ep->reconnect_on() ? kMaxReconnects * (conduits.size() - 1) : 0));
  for (size_t i = 0; i < conduits.size(); ++i)
    ep->streams_.push_back(ep->make_stream(static_cast<int>(i), std::move(conduits[i])));
  // More than one stream: the streams' transport stripes the inline chunks over them.
  if (ep->streams_.size() > 1) {
    auto wake = [e = ep.get()](int i) { e->streams_[static_cast<size_t>(i)]->wake(); };
    for (const auto& t : ep->session_.agreed)
      if (t->gives() == Gives::kStreams)
        ep->striping_ =
            t->striping(StripingSetup{ep->streams_.size(), ep->session_.chunk_size, p.host_chunk_size, wake,
                                      ep->session_.multilink, ep->streams_.capacity()});
    assert(ep->striping_ && "more than one stream: the agreed kStreams transport stripes them");
  }
  assert((!ep->has_paths_ || ep->streams_.size() == 1) && "negotiate() opens one stream with a payload path");
  if (ep->session_.multilink) {
    ep->links_.resize(ep->streams_.size());
    ep->links_alive_ = static_cast<int>(ep->streams_.size()) - 1;
  }
  DMX_LOG_INFO("endpoint to {}: path {} ({}), {} streams, chunk {}", ep->session_.peer, ep->session_.transport,
               ep->session_.reason, ep->streams_.size(), format_size(ep->session_.chunk_size));
  for (auto& ps : ep->paths_)
    if (ps.path) DMX_LOG_INFO("endpoint to {}: {}", ep->session_.peer, ps.path->describe());
  // All set before the first thread starts: a path that fails at once ends the endpoint on its own
  // thread, and end() releases the slot. Stream 0's bytes and inline operations count under the
  // transport that made its conduit.
  for (const auto& t : ep->session_.agreed)
    if (t->gives() == Gives::kControl) ep->stream_transport_ = ep->ctx_->metrics().index_of(t->name());
  ep->ctx_->metrics().add_endpoint(ep.get(), ep->stream_transport_);  // before a stream can stop
  ep->ctx_->endpoint_started(ep->session_.peer_key, ep);
  ep->ctx_->watch_peer(ep->session_.peer_name, ep->session_.peer_epoch, ep);
  ep->slot_held_ = true;
  if (!ep->session_.is_client && ep->reconnect_on()) ep->ctx_->add_rejoinable(ep->session_.session_id, ep);
  // Paths first, streams last: once a stream runs it may stop the paths (stop_paths) at any time,
  // so nothing here touches them after that. No keep-alive for paths: stop_paths() waits for every
  // on_path_stopped, so the endpoint is never destroyed on a path's own thread.
  for (auto& ps : ep->paths_)
    if (ps.path) ep->paths_running_ |= path_bit(ps.id);
  for (auto& ps : ep->paths_)
    if (ps.path) ps.path->start(ps.events.get(), nullptr);
  ep->running_ = static_cast<int>(ep->streams_.size());
  ep->holders_->count = ep->running_;
  stream::Workers* workers = &ep->ctx_->workers();
  if (p.workers_per_endpoint) {
    ep->own_workers_ = std::make_unique<stream::Workers>(1, "dmx-ep");
    workers = ep->own_workers_.get();
  }
  // Inline chunks ride the data streams: stream 0 alone, or 1..N beside it; with a payload path
  // the one stream carries control frames and the paths' chunk headers only.
  for (size_t i = 0; i < ep->streams_.size(); ++i) {
    bool bulk = !ep->has_paths_ && (i > 0 || ep->streams_.size() == 1);
    workers->add(ep->streams_[i].get(), bulk, ep, [h = ep->holders_] { h->release(); });
  }
  return ep;
}

std::unique_ptr<stream::Stream> EndpointImpl::make_stream(int index, std::unique_ptr<stream::Conduit> conduit) {
  const EngineParams& p = params_;
  stream::StreamConfig sc;
  sc.index = index;
  sc.chunk_size = session_.chunk_size;
  sc.slots = p.staging_slots;
  sc.limits = wire::Limits{session_.chunk_size, p.eager_limit};
  sc.keepalive = session_.keepalive;
  sc.peer_timeout = p.peer_timeout;
  sc.busy_peer_timeout = p.busy_peer_timeout;
  sc.peer = session_.peer;
  sc.busy_poll = p.busy_poll;
  sc.checksum = session_.checksum;
  sc.push_tx_max = p.push_tx.max;
  sc.push_rx_max = p.push_rx.max;
  return std::make_unique<stream::Stream>(sc, std::move(conduit), this, &ctx_->staging());
}

EndpointImpl::EndpointImpl(std::shared_ptr<ContextImpl> ctx, Session session)
    : ctx_(std::move(ctx)), session_(std::move(session)), params_(ctx_->params()) {
  peer_credit_ = static_cast<int64_t>(session_.peer_unexpected_budget);
}

EndpointImpl::~EndpointImpl() {
  join_or_reap(reconnect_thread_);  // done: it held this endpoint until it returned
  if (!session_.is_client && reconnect_on()) ctx_->remove_rejoinable(session_.session_id);
  release_slot();  // a stream that never ran (nothing else can hold mu_ now)
  ctx_->metrics().remove_endpoint(this, stats());  // when no stream stopped it (see on_stream_stopped)
  // A path that missed stop_timeout may still call our events: destroying it (joining its thread)
  // must come before the members those events use.
  for (auto& ps : paths_) ps.path.reset();
}

// A worker may run this endpoint's streams: waiting there for them could wait forever.
bool EndpointImpl::on_worker_thread() const {
  return stream::Workers::on_worker_thread();
}

// The first payload path that carried the op's bytes (in the agreed order), else stream 0's
// conduit.
MetricTransport EndpointImpl::metric_transport_of(const OpState& op) const {
  if (op.via == 0) return stream_transport_;
  auto id = static_cast<size_t>(std::countr_zero(op.via));
  if (id == 0 || id > session_.agreed.size()) return stream_transport_;
  return ctx_->metrics().index_of(session_.agreed[id - 1]->name());
}

// Delivers finished operations in order: the front of each queue, while finished. One thread
// delivers at a time; others leave their work to it.
void EndpointImpl::deliver() {
  if (undelivered_.load(std::memory_order_acquire) == 0) return;  // nothing finished: no lock
  std::unique_lock<std::mutex> lock(mu_);
  if (delivering_) {
    redeliver_ = true;
    return;
  }
  delivering_ = true;
  for (;;) {
    redeliver_ = false;
    std::vector<std::shared_ptr<OpState>> batch;
    for (auto* q : {&initiated_, &received_}) {
      while (!q->empty() && q->front()->phase == OpPhase::kFinished) {
        q->front()->phase = OpPhase::kDelivered;
        undelivered_.fetch_sub(1, std::memory_order_release);
        batch.push_back(std::move(q->front()));
        q->pop_front();
      }
    }
    awaiting_.store(!initiated_.empty() || !received_.empty(), std::memory_order_relaxed);
    if (batch.empty() && !redeliver_) break;
    lock.unlock();
    DMX_TRACE_POINT("deliver.batch");
    auto now = Clock::now();
    for (auto& op : batch) {
      // The outcome and counters were written under mu_, which this thread took after them.
      Status s = op->outcome;
      size_t bytes = s.ok() ? op->done : 0;
      // Counted before the completion shows, so a waiter that wakes sees it in the metrics.
      ctx_->metrics().record(metric_transport_of(*op), static_cast<size_t>(op->type), s.code(), now - op->posted);
      if (!s.ok()) s = s.with_peer(session_.peer);
      {
        std::lock_guard<std::mutex> g(op->mu);
        op->final_status = s;
        op->final_bytes = bytes;
        op->final_crc = s.ok() && session_.checksum ? crc32c::from_raw(op->crc_raw, bytes) : 0;
        op->matched_tag = op->tag;
      }
      if (op->callback) op->callback(s, bytes);
      {
        std::lock_guard<std::mutex> g(op->mu);
        op->completed.store(true, std::memory_order_release);
      }
      DMX_TRACE_POINT("op.completed");
      op->cv.notify_all();
    }
    lock.lock();
  }
  delivering_ = false;
}

void EndpointImpl::on_stream_failed(int stream, const Status& s) {
  if (link_failed(stream, s)) return;  // one of several links: the others carry its chunks
  fail(s);
}

// However the connection broke — a stream's reset or EOF, the shm pipe's hung-up side channel, a
// path's peer gone, silence past peer_timeout — the application sees one code and one message form,
// whichever part of the endpoint noticed first. Violations and local faults keep their own code.
Status as_lost_peer(const Status& s) {
  if (s.code() != Code::kPeerFailed && s.code() != Code::kIo && s.code() != Code::kClosed) return s;
  if (s.message().starts_with("lost the peer: ")) return s;
  Status lost(Code::kPeerFailed, fmt::format("lost the peer: {}", s.message()));
  if (!s.origin().empty()) lost = lost.with_origin(s.origin());
  return s.peer().empty() ? lost : lost.with_peer(s.peer());
}

void EndpointImpl::fail(Status s) { end(as_lost_peer(s)); }

void EndpointImpl::end(Status s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_.ok()) {
      status_ = s;
      if (s.code() != Code::kClosed) DMX_LOG_ERROR("endpoint to {} failed: {}", session_.peer, s.to_string());
    }
    release_slot();  // the peer is gone or we are: the slot is free now, not once the threads are
    for (auto& st : streams_) st->stop();  // one stream down ends them all
    cancel_dial_locked();
  }
  notes_cv_.notify_all();
  reconnect_cv_.notify_all();
}

void EndpointImpl::release_slot() {
  if (!slot_held_) return;
  slot_held_ = false;
  ctx_->endpoint_stopped(session_.peer_key, this);
}

namespace {
// An endpoint younger than this is not evicted: its application may not have posted anything yet.
constexpr auto kEvictGrace = std::chrono::milliseconds(500);
// An evicted endpoint's peer is told in a CLOSE and answers by ending its streams; a peer that
// does not is cut off this much later.
constexpr auto kEvictedCloseWait = std::chrono::seconds(2);
}  // namespace

bool EndpointImpl::evict_if_idle(const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!status_.ok() || !slot_held_ || Clock::now() - created_ < kEvictGrace) return false;
    bool busy = !initiated_.empty() || !received_.empty() || !posted_.empty() || !unexpected_.empty() ||
                !tx_.empty() || !sends_.empty() || !writes_.empty() || !reads_.empty() || !tokens_.empty() ||
                !in_writes_.empty() || !serving_.empty() || !notes_.empty();
    if (busy) return false;
    status_ = why.with_peer(session_.peer);
    DMX_LOG_WARN("endpoint to {}: {}", session_.peer, why.message());
    release_slot();
    cancel_dial_locked();
    FrameHeader h;
    h.type = FrameType::kClose;
    std::string reason = why.message().substr(0, wire::kMaxControlPayload);
    push_control(h, std::vector<unsigned char>(reason.begin(), reason.end()));
    evicted_stop_at_ = Clock::now() + kEvictedCloseWait;
    next_deadline_ns_.store(std::min(next_deadline_ns_.load(), evicted_stop_at_.time_since_epoch().count()));
  }
  wake_streams();
  notes_cv_.notify_all();
  reconnect_cv_.notify_all();
  return true;
}

void EndpointImpl::on_stream_stopped(int stream) {
  if (session_.multilink) link_stopped(stream);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (--running_ > 0) return;
  }
  all_stopped();
}

void EndpointImpl::all_stopped() {
  // The last stream is gone; the paths stop too (each waits until its copies no longer use user
  // memory) before everything left fails.
  stop_paths();
  ctx_->metrics().remove_endpoint(this, stats());  // final: nothing moves bytes any more
  {
    std::lock_guard<std::mutex> lock(mu_);
    fail_all();
    release_slot();  // at the latest here: before close() can return
    stopped_ = true;  // close() returns from here on: no stream or path touches user memory
  }
  stopped_cv_.notify_all();
  notes_cv_.notify_all();
  deliver();
}

// Every worker has exited: nothing touches user memory any more. Fails all that is left.
// Caller holds mu_.
void EndpointImpl::fail_all() {
  if (status_.ok()) status_ = Status(Code::kClosed, "endpoint stopped");
  for (auto* q : {&initiated_, &received_})
    for (auto& op : *q) finish(*op, status_);
  auto serving = std::move(serving_);  // finish() erases from it
  for (auto& [id, op] : serving) finish(*op, status_);
  for (auto& [id, w] : in_writes_)
    release_write(w);
  for (auto& [id, v] : vec_reads_)
    for (auto& r : v.regs) ContextImpl::release_registration(*r);
  vec_reads_.clear();
  tx_.clear();
  resend_.clear();
  for (auto& l : links_) l.unacked.clear();
  has_tx_.store(false, std::memory_order_release);
  posted_.clear();
  sends_.clear();
  writes_.clear();
  reads_.clear();
  tokens_.clear();
  token_of_msg_.clear();
  in_writes_.clear();
  if (peer_closed_) leftover_ = std::move(unexpected_);
  unexpected_.clear();
  deadlines_.clear();
}

// Orderly close: CLOSE goes out on stream 0 and the peer answers by ending its streams, so it
// learns "closed by the peer" rather than seeing a reset. A peer that does not answer in time is
// cut off.
Status EndpointImpl::close() {
  bool sent = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    peer_closed_ = false;  // closed here too: what the peer sent before its close goes with it
    paths_cv_.notify_all();  // stop_paths no longer waits for the peer's chunks to land
    leftover_.clear();
    if (status_.ok()) {
      status_ = Status(Code::kClosed, "the endpoint was closed by this side");
      release_slot();
      cancel_dial_locked();
      FrameHeader h;
      h.type = FrameType::kClose;
      std::string reason = "closed by the application";
      push_control(h, std::vector<unsigned char>(reason.begin(), reason.end()));
      sent = true;
    }
  }
  notes_cv_.notify_all();
  reconnect_cv_.notify_all();
  if (on_worker_thread()) {  // a callback closing its own endpoint: no waiting on ourselves
    for (auto& st : streams_) st->stop();
    return Status();
  }
  Status result;
  {
    std::unique_lock<std::mutex> lock(mu_);
    bool done = sent && stopped_cv_.wait_for(lock, std::chrono::seconds(2), [&] { return stopped_; });
    if (!done) {
      for (auto& st : streams_) st->stop();
      // The last worker gives up on its paths at stop_timeout (stop_paths): a little more here.
      auto limit = params_.stop_timeout + std::chrono::seconds(5);
      if (!stopped_cv_.wait_for(lock, limit, [&] { return stopped_; })) {
        Status s(Code::kTimeout, fmt::format("close: the stream workers to {} did not stop within {} ms",
                                             session_.peer, std::chrono::duration_cast<std::chrono::milliseconds>(limit).count()));
        DMX_LOG_ERROR("endpoint to {}: {}", session_.peer, s.message());
        return s.with_peer(session_.peer);
      }
    }
    result = stop_error_;  // logged where it was found
  }
  // The workers are done with user memory; wait until they have also let go of this endpoint, so
  // that the owner destroys it (and joins them).
  std::shared_ptr<Holders> h = holders_;
  std::unique_lock<std::mutex> g(h->mu);
  if (!h->cv.wait_for(g, std::chrono::seconds(5), [&] { return h->count == 0; })) {
    DMX_LOG_WARN("endpoint to {}: a worker still holds the endpoint 5 s after it stopped", session_.peer);
    if (result.ok())
      result = Status(Code::kTimeout, "close: a stream worker still holds the endpoint 5 s after it stopped")
                   .with_peer(session_.peer);
  }
  return result;
}

Clock::time_point EndpointImpl::on_tick() {
  if (ctl_overflow_.load(std::memory_order_relaxed)) {
    fail(Status(Code::kProtocol, "the peer acknowledges none of our control frames (several links)"));
    return Clock::time_point::max();
  }
  int64_t due = next_deadline_ns_.load(std::memory_order_relaxed);
  if (Clock::now().time_since_epoch().count() < due)
    return due == INT64_MAX ? Clock::time_point::max() : Clock::time_point(Clock::duration(due));
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto now = Clock::now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      auto op = deadlines_.begin()->second.lock();
      deadlines_.erase(deadlines_.begin());
      if (!op) continue;
      stop(op, Status(Code::kTimeout, "the operation did not complete before its deadline"));
    }
    if (now >= evicted_stop_at_) {  // evicted, and the peer did not end its streams in time
      evicted_stop_at_ = Clock::time_point::max();
      for (auto& st : streams_) st->stop();
    }
    int64_t next = deadlines_.empty() ? INT64_MAX : deadlines_.begin()->first.time_since_epoch().count();
    if (evicted_stop_at_ != Clock::time_point::max())
      next = std::min(next, evicted_stop_at_.time_since_epoch().count());
    next_deadline_ns_.store(next);
  }
  deliver();
  int64_t next = next_deadline_ns_.load(std::memory_order_relaxed);
  return next == INT64_MAX ? Clock::time_point::max() : Clock::time_point(Clock::duration(next));
}

Status EndpointImpl::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_.with_peer(session_.peer);
}

EndpointStats EndpointImpl::stats() const {
  EndpointStats s;
  s.transport = session_.transport;
  s.reason = session_.reason;
  s.gpu_push = "staged send: " + params_.push_tx.why + "; staged receive: " + params_.push_rx.why;
  device_stats(&s);
  s.control_stream = streams_.empty() ? "" : streams_[0]->conduit_kind();
  s.peer = session_.peer;
  s.streams = static_cast<uint32_t>(streams_.size());
  for (const auto& st : streams_) {
    stream::StreamStats x = st->stats();
    s.bytes_sent += x.bytes_sent;
    s.bytes_received += x.bytes_received;
    s.d2h_copies += x.d2h_copies;
    s.d2h_bytes += x.d2h_bytes;
    s.h2d_copies += x.h2d_copies;
    s.h2d_bytes += x.h2d_bytes;
    s.gpu_pushes += x.pushes;
    s.staging_lists += x.lists;
    s.send_seconds += static_cast<double>(x.ns_send) * 1e-9;
    s.recv_seconds += static_cast<double>(x.ns_recv) * 1e-9;
    s.copy_wait_seconds += static_cast<double>(x.ns_copy_wait) * 1e-9;
    s.stream_bytes_sent.push_back(x.bytes_sent);
    s.stream_bytes_received.push_back(x.bytes_received);
  }
  std::lock_guard<std::mutex> lock(mu_);  // also guards the path pointers (stop_paths resets them)
  for (const auto& ps : paths_)
    if (ps.path) s.paths.push_back(path_use(*ps.path));
  s.paths.insert(s.paths.end(), stopped_paths_.begin(), stopped_paths_.end());
  s.messages_sent = counters_.messages_sent;
  s.messages_received = counters_.messages_received;
  s.eager_sends = counters_.eager;
  s.rendezvous_sends = counters_.rendezvous;
  s.writes = counters_.writes;
  s.reads = counters_.reads;
  s.host_copies = counters_.host_copies;
  s.host_copy_bytes = counters_.host_copy_bytes;
  s.checksum = session_.checksum;
  s.checksum_errors = counters_.checksum_errors;
  s.reconnects = reconnects_;
  return s;
}

}  // namespace dmx
