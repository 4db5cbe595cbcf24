// Endpoint: posting operations, cancellation and the control frames they send.
#include <fmt/format.h>

#include <cstring>

#include "core/log.h"
#include "core/trace.h"
#include "engine/endpoint/endpoint_impl.h"
#include "engine/endpoint/internal.h"

namespace dmx {

using wire::FrameHeader;
using wire::FrameType;
using namespace endpoint;

std::shared_ptr<OpState> EndpointImpl::new_op(OpType type, const MemRegion& region, const OpOptions& o) {
  auto op = std::make_shared<OpState>();
  op->type = type;
  op->region = region;
  op->total = region.size;
  if (type != OpType::kRecv) op->known_size.store(region.size, std::memory_order_relaxed);
  op->callback = o.on_complete;
  if (o.on_complete_tag) {  // the op owns its callback, so the raw pointer outlives every call
    op->callback = [self = op.get(), f = o.on_complete_tag](const Status& s, size_t n) { f(s, n, self->matched_tag); };
  }
  op->ep = weak_from_this();
  op->posted = Clock::now();
  if (o.timeout != kForever) op->deadline = Clock::now() + o.timeout;
  return op;
}

// Queues `op` for ordered completion; registers its deadline. Caller holds mu_.
Request EndpointImpl::start(const std::shared_ptr<OpState>& op, std::deque<std::shared_ptr<OpState>>& queue) {
  queue.push_back(op);
  // The first pending operation: stream 0 may sleep on the idle timers, and from now on holds the
  // peer to busy_peer_timeout.
  if (!awaiting_.exchange(true, std::memory_order_relaxed) && !streams_.empty()) control_stream().wake();
  if (op->deadline != Clock::time_point::max()) {
    deadlines_.emplace(op->deadline, op);
    int64_t ns = op->deadline.time_since_epoch().count();
    if (ns < next_deadline_ns_.load()) {
      next_deadline_ns_.store(ns);
      if (!streams_.empty()) control_stream().wake();  // it may be asleep until a later deadline
    }
  }
  return Request(op);
}

void EndpointImpl::push_control(FrameHeader h, std::vector<unsigned char> payload, std::shared_ptr<OpState> op) {
  stream::TxItem item;
  item.header = h;
  item.owned = std::move(payload);
  item.src = item.owned.data();
  item.len = item.owned.size();
  item.ctx = std::move(op);
  push_item(std::move(item));
}

void EndpointImpl::push_reply(FrameHeader h, std::vector<unsigned char> payload) {
  stream::TxItem item;
  item.header = h;
  item.owned = std::move(payload);
  item.src = item.owned.data();
  item.len = item.owned.size();
  item.reply = true;
  push_item(std::move(item));
}

bool EndpointImpl::rx_paused() { return control_stream().reply_backlog() > params_.max_reply_backlog; }

Status EndpointImpl::note_refusal(const Status& what) {
  auto now = Clock::now();
  if (now - refusals_since_ > std::chrono::seconds(10)) {
    refusals_since_ = now;
    refusals_ = 0;
  }
  if (++refusals_ > params_.peer_error_budget)
    return Status(Code::kResourceExhausted,
                  fmt::format("the peer caused more than {} refused operations within 10 s (peer_error_budget; the "
                              "last: {}); closing it",
                              params_.peer_error_budget, what.message()));
  DMX_LOG_LIMITED(peer_log_, warn, "refused", "peer {}: {}", session_.peer, what.message());
  return Status();
}

void EndpointImpl::send_ack(uint64_t id, wire::OpKind kind, const Status& s) {
  FrameHeader h;
  h.type = FrameType::kAck;
  h.id = id;
  h.a0 = static_cast<uint64_t>(s.code());
  h.a1 = static_cast<uint64_t>(kind);
  std::string text = s.message().substr(0, wire::kMaxControlPayload);
  push_reply(h, std::vector<unsigned char>(text.begin(), text.end()));
}

void EndpointImpl::wake_streams() {
  for (auto& s : streams_) s->wake();
}

Request EndpointImpl::post_send(const MemRegion& src, uint64_t tag, OpOptions o) {
  DMX_TRACE_POINT("send.post");
  auto op = new_op(OpType::kSend, src, o);
  return post_send_op(op, src, tag);
}

// `src`: the message (vectored: null, of the list's total size and memory kind).
Request EndpointImpl::post_send_op(const std::shared_ptr<OpState>& op, const MemRegion& src, uint64_t tag) {
  op->tag = tag;
  Status bad = op->vec ? Status() : region_problem(src, "send");
  // Small messages travel inline (eager). The frame points into the caller's buffer, which stays
  // dmx's until the frame is written (on_sent completes the op; stop() leaves eager ops alone and
  // fail_all() runs after the workers exit); device memory is staged by the stream through a
  // pinned slot. A vectored message is gathered into the frame now (host memory only).
  // With several links an eager message's bytes are copied (control.cc): host memory only.
  bool try_eager = bad.ok() && src.size <= session_.peer_eager_limit &&
                   !((op->vec || session_.multilink) && src.where.is_device());
  DMX_TRACE_POINT("send.op");
  std::unique_lock<std::mutex> lock(mu_);
  DMX_TRACE_POINT("send.locked");
  Request r = start(op, initiated_);
  if (!status_.ok() || !bad.ok()) {
    finish(*op, bad.ok() ? status_ : bad);
  } else {
    op->id = next_msg_++;
    ++counters_.messages_sent;
    uint64_t cost = src.size + kEagerOverhead;
    FrameHeader h;
    h.id = op->id;
    h.a0 = tag;
    if (try_eager && peer_credit_ >= static_cast<int64_t>(cost)) {
      peer_credit_ -= static_cast<int64_t>(cost);
      ++counters_.eager;
      op->eager = true;
      op->phase = OpPhase::kActive;
      h.type = FrameType::kEager;
      if (src.size > 0 && !op->vec && post_eager_by_path(op, src, h)) {
        DMX_TRACE_POINT("send.queued");
      } else {
        stream::TxItem item;
        item.header = h;
        item.src = src.ptr;
        item.where = src.where;
        item.len = src.size;
        item.ctx = op;
        if (op->vec) {
          item.owned.resize(src.size);
          for (const VecSeg& seg : op->vec->segs) std::memcpy(item.owned.data() + seg.at, seg.local, seg.length);
          item.src = item.owned.data();
          item.where = MemSpec{};
        } else if (session_.multilink) {  // kept until the peer has it, to go again if its stream dies
          item.owned.assign(static_cast<const unsigned char*>(src.ptr),
                            static_cast<const unsigned char*>(src.ptr) + src.size);
          item.src = item.owned.data();
          item.where = MemSpec{};
        }
        push_item(std::move(item));
      }
    } else {
      ++counters_.rendezvous;
      sends_[op->id] = op;
      h.type = FrameType::kRts;
      h.a1 = src.size;
      push_control(h);
    }
  }
  lock.unlock();
  deliver();
  return r;
}

// The receiver copies the bytes out of `src` (one device copy, no staging); PATH_DONE completes
// the send. The header is queued now, so that it keeps its place among the message frames and
// the path's chunk headers (a later send's RTS must not overtake it). False: no path carries
// `src`, and the send goes inline.
bool EndpointImpl::post_eager_by_path(const std::shared_ptr<OpState>& op, const MemRegion& src, FrameHeader h) {
  PathState* path = eager_path(src.where);
  if (path == nullptr) return false;
  Transfer t{op, FrameType::kEager, static_cast<const char*>(src.ptr), src.where};
  stream::TxItem item;
  item.header = h;
  Status st = post_path_chunk(*path, t, src.size, &item);
  if (st.code() == Code::kUnavailable) {  // memory CUDA IPC cannot export
    note_fallback(*path, st);
    return false;
  }
  if (!st.ok()) {
    finish(*op, chunk_failure(st));
    return true;
  }
  streams_[0]->push_control(std::move(item));
  return true;
}

Request EndpointImpl::post_recv(const MemRegion& dst, uint64_t tag, OpOptions o) {
  DMX_TRACE_POINT("recv.post");
  auto op = new_op(OpType::kRecv, dst, o);
  op->tag = op->posted_tag = tag;
  return post_recv_op(op, dst);
}

Request EndpointImpl::post_recv_op(const std::shared_ptr<OpState>& op, const MemRegion& dst) {
  Status bad = op->vec ? Status() : region_problem(dst, "recv");
  std::unique_lock<std::mutex> lock(mu_);
  Request r = start(op, received_);
  if (bad.ok() && !status_.ok() && peer_closed_ && take_after_close(op)) {
    // a message that arrived before the peer closed
  } else if (!status_.ok() || !bad.ok()) {
    finish(*op, bad.ok() ? status_ : bad);
  } else {
    match_recv(op, /*front=*/false);
  }
  lock.unlock();
  deliver();
  return r;
}

Request EndpointImpl::post_write(const MemRegion& src, const RemoteRegion& dst, uint64_t offset, OpOptions o) {
  return post_one_sided(OpType::kWrite, src, dst, offset, std::move(o));
}

Request EndpointImpl::post_read(const MemRegion& dst, const RemoteRegion& src, uint64_t offset, OpOptions o) {
  return post_one_sided(OpType::kRead, dst, src, offset, std::move(o));
}

// A write (local -> remote) or a read (remote -> local) of `local.size` bytes at `offset` of the
// peer's registered region. Bounds are checked against the advertised size before anything is sent.
Request EndpointImpl::post_one_sided(OpType type, const MemRegion& local, const RemoteRegion& remote, uint64_t offset,
                                     OpOptions o) {
  const bool write = type == OpType::kWrite;
  auto op = new_op(type, local, o);
  op->rkey = remote.key;
  op->roffset = offset;
  op->notify = write && o.notify;
  op->notify_value = o.notify_value;
  Status bad = region_problem(local, write ? "write" : "read");
  if (bad.ok() && remote.epoch != 0 && remote.epoch != session_.peer_epoch)
    bad = Status(Code::kPeerFailed,
                 fmt::format("{}: the region was published by epoch {} of its owner, this endpoint's peer is {} epoch "
                             "{}: a stale region, refused (nothing sent)",
                             write ? "write" : "read", remote.epoch, session_.peer_name.empty() ? "an unnamed peer" : session_.peer_name,
                             session_.peer_epoch));
  if (bad.ok() && (offset > remote.size || local.size > remote.size - offset))
    bad = Status(Code::kOutOfRange, fmt::format("{} of {} bytes at offset {} exceeds the remote region of {} bytes",
                                                write ? "write" : "read", local.size, offset, remote.size));
  std::unique_lock<std::mutex> lock(mu_);
  Request r = start(op, initiated_);
  if (!status_.ok() || !bad.ok()) {
    finish(*op, bad.ok() ? status_ : bad);
  } else if (write) {
    op->id = next_op_++;
    op->phase = OpPhase::kActive;
    ++counters_.writes;
    writes_[op->id] = op;
    tx_.push_back(Transfer{op, FrameType::kWriteData, static_cast<const char*>(local.ptr), local.where});
    tx_.back().accepts = write_accepts();
    has_tx_.store(true, std::memory_order_release);
    wake_for(tx_.back());
  } else {
    op->id = next_op_++;
    ++counters_.reads;
    reads_[op->id] = Inbound{op, 0, local.size, 0, local.size};
    FrameHeader h;
    h.type = FrameType::kReadReq;
    h.id = op->id;
    h.a0 = remote.key;
    h.a1 = offset;
    h.a2 = local.size;
    h.a3 = accepts_for(local.where);
    push_control(h);
  }
  lock.unlock();
  deliver();
  return r;
}

// Decides the outcome. Caller holds mu_; deliver() runs later, without it.
void EndpointImpl::finish(OpState& op, Status s) {
  if (op.phase == OpPhase::kFinished || op.phase == OpPhase::kDelivered) return;
  op.outcome = std::move(s);
  op.phase = OpPhase::kFinished;
  if (op.deadline != Clock::time_point::max()) {
    // Its deadline entry goes now, not when it would have expired: with long timeouts and many
    // operations the table would otherwise hold every operation of the last timeout period.
    auto [first, last] = deadlines_.equal_range(op.deadline);
    for (auto it = first; it != last;) {
      auto held = it->second.lock();
      it = held == nullptr || held.get() == &op ? deadlines_.erase(it) : std::next(it);
    }
  }
  if (op.type != OpType::kReadResponse) undelivered_.fetch_add(1, std::memory_order_release);
  if (op.type == OpType::kReadResponse && (op.reg || !op.regs.empty())) {
    if (op.reg) ContextImpl::release_registration(*op.reg);
    op.reg.reset();
    for (auto& r : op.regs) ContextImpl::release_registration(*r);
    op.regs.clear();
    serving_.erase(op.id);
  }
}

void EndpointImpl::cancel(const std::shared_ptr<OpState>& op, Status why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop(op, std::move(why));
  }
  deliver();
}

// Ends `op` early with `why`, releasing its buffer as soon as no chunk in flight uses it.
// Caller holds mu_.
void EndpointImpl::stop(std::shared_ptr<OpState> op, Status why) {
  if (op->phase == OpPhase::kStopping || op->phase == OpPhase::kFinished || op->phase == OpPhase::kDelivered) return;
  if (op->eager) return;  // already on the wire in one frame; completes when written
  switch (op->type) {
    case OpType::kRecv:
      if (op->phase == OpPhase::kPosted) {
        std::erase(posted_, op);
        finish(*op, std::move(why));
        return;
      }
      for (auto& u : unexpected_)
        if (u->waiting == op) {  // claimed an eager message that has not landed yet: let it go
          u->waiting = nullptr;
          finish(*op, std::move(why));
          return;
        }
      // Matched: tell the sender to stop; later chunks are dropped (the token stays).
      send_ack(op->id, wire::OpKind::kSend, why);
      break;
    case OpType::kSend:
      if (op->phase == OpPhase::kPosted) {  // RTS sent, no CTS yet
        FrameHeader h;
        h.type = FrameType::kCancel;
        h.id = op->id;
        h.a0 = 0;
        h.a1 = static_cast<uint64_t>(wire::OpKind::kSend);
        push_control(h);
        sends_.erase(op->id);
        finish(*op, std::move(why));
        return;
      }
      [[fallthrough]];
    case OpType::kWrite:
    case OpType::kReadResponse:  // chunks not yet handed out are dropped
      std::erase_if(tx_, [&](const Transfer& t) { return t.op == op; });
      has_tx_.store(!tx_.empty(), std::memory_order_release);
      break;
    case OpType::kRead:
      break;
  }
  op->phase = OpPhase::kStopping;
  op->outcome = std::move(why);
  settle_stopped(op);
}

// Finishes a stopping op once nothing in flight uses its buffer. Caller holds mu_.
void EndpointImpl::settle_stopped(std::shared_ptr<OpState> op) {
  if (op->phase != OpPhase::kStopping || op->inflight > 0) return;
  if ((op->type == OpType::kSend || op->type == OpType::kWrite) && op->handed < op->total) {
    // Tell the receiver how many bytes will come, so it can drop them and forget the message.
    FrameHeader h;
    h.type = FrameType::kCancel;
    h.id = op->id;
    h.a0 = op->handed;
    h.a1 = static_cast<uint64_t>(op->type == OpType::kSend ? wire::OpKind::kSend : wire::OpKind::kWrite);
    push_control(h);
  }
  if (op->type == OpType::kReadResponse && op->handed < op->total && status_.ok()) {
    // A read response that cannot go on (a payload path failed a chunk): the reader stops
    // waiting for the rest.
    send_ack(op->id, wire::OpKind::kRead, op->outcome);
  }
  if (op->type == OpType::kSend) sends_.erase(op->id);
  if (op->type == OpType::kWrite) writes_.erase(op->id);
  for (auto& [key, in] : tokens_)
    if (in.op == op) in.op = nullptr;
  if (auto it = reads_.find(op->id); op->type == OpType::kRead && it != reads_.end()) it->second.op = nullptr;
  Status outcome = op->outcome;
  finish(*op, std::move(outcome));
}

void EndpointImpl::set_note_handler(std::function<void(const Notification&)> handler) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    note_handler_ = std::make_shared<std::function<void(const Notification&)>>(std::move(handler));
    has_note_handler_.store(true, std::memory_order_release);
  }
  dispatch_notes();
}

// Hands waiting notifications to the handler, outside the lock. One thread at a time, like
// deliver(): another that finds it busy leaves its notifications to it.
void EndpointImpl::dispatch_notes() {
  if (!has_note_handler_.load(std::memory_order_acquire)) return;
  std::unique_lock<std::mutex> lock(mu_);
  if (noting_) return;  // that thread's loop takes ours too
  noting_ = true;
  for (;;) {
    if (notes_.empty() || !status_.ok()) break;
    std::deque<Notification> batch;
    batch.swap(notes_);
    auto handler = note_handler_;
    lock.unlock();
    for (const Notification& n : batch) (*handler)(n);
    lock.lock();
  }
  noting_ = false;
}

Result<Notification> EndpointImpl::next_notification(Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [&] { return !notes_.empty() || !status_.ok(); };
  if (timeout == kForever) notes_cv_.wait(lock, ready);
  else if (!notes_cv_.wait_for(lock, timeout, ready))
    return Status(Code::kTimeout, "no notification arrived in time").with_peer(session_.peer);
  if (notes_.empty()) return status_.with_peer(session_.peer);
  Notification n = notes_.front();
  notes_.pop_front();
  return n;
}

}  // namespace dmx
