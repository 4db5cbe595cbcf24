// Endpoint: frames arriving from the peer. Every field is untrusted: ids, sizes, offsets and
// keys are checked against what this side announced or registered before any byte moves; a
// violation is a protocol error that fails the endpoint (and names the peer).
#include <fmt/format.h>

#include "core/checked.h"
#include "core/log.h"
#include "core/trace.h"
#include "engine/endpoint_impl.h"

namespace dmx {

using wire::FrameHeader;
using wire::FrameType;

namespace {
constexpr uint64_t kEagerOverhead = 64;
constexpr uint64_t kUnknownTotal = UINT64_MAX;
enum HostTag : int { kTagNone = 0, kTagEagerMatched, kTagEagerUnexpected, kTagCounted };

Status protocol(std::string text) { return Status(Code::kProtocol, std::move(text)); }
}  // namespace

tcp::RxPlan EndpointImpl::plan_into(const MemRegion& dst, std::shared_ptr<void> ctx) const {
  tcp::RxPlan p;
  p.kind = dst.where.is_device() ? tcp::RxPlan::Kind::kDevice : tcp::RxPlan::Kind::kHost;
  p.dst = dst.ptr;
  p.where = dst.where;
  p.ctx = std::move(ctx);
  return p;
}

Status EndpointImpl::check_new_msg(uint64_t msg) {
  if (msg <= highest_msg_) return protocol(fmt::format("message id {} does not follow {}", msg, highest_msg_));
  highest_msg_ = msg;
  ++counters_.messages_received;
  return Status();
}

Result<tcp::RxPlan> EndpointImpl::on_header(int stream, const FrameHeader& h) {
  std::lock_guard<std::mutex> lock(mu_);
  DMX_TRACE_POINT("on_header.locked");
  switch (h.type) {
    case FrameType::kEager:
      if (h.path != 0) {  // the payload is the path's descriptor of the message
        if (stream != 0) return protocol(fmt::format("{} arrived on stream {}, not 0", wire::describe(h), stream));
        tcp::RxPlan p;
        p.kind = tcp::RxPlan::Kind::kControl;
        return p;
      }
      return plan_eager(h, h.payload_len);
    case FrameType::kSendData:
    case FrameType::kReadData:
    case FrameType::kWriteData:
      if (h.path != 0) {  // the payload is the path's descriptor of the chunk
        if (stream != 0) return protocol(fmt::format("{} arrived on stream {}, not 0", wire::describe(h), stream));
        tcp::RxPlan p;
        p.kind = tcp::RxPlan::Kind::kControl;
        return p;
      }
      if (h.type == FrameType::kSendData) return plan_inbound(tokens_, h, h.a0, h.a1, h.payload_len, "SEND_DATA");
      if (h.type == FrameType::kReadData) return plan_inbound(reads_, h, h.a0, h.a1, h.payload_len, "READ_DATA");
      return plan_write(h, h.payload_len);
    case FrameType::kAck:
    case FrameType::kClose: {
      tcp::RxPlan p;
      p.kind = tcp::RxPlan::Kind::kControl;
      return p;
    }
    case FrameType::kHello:
    case FrameType::kAuth:
    case FrameType::kJoin:
    case FrameType::kWelcome:
    case FrameType::kReject:
      return protocol(fmt::format("handshake frame {} after the handshake", wire::frame_type_name(h.type)));
    default:
      return tcp::RxPlan();  // no payload; handled in on_landed
  }
}

Status EndpointImpl::on_landed(int stream, const FrameHeader& h, tcp::RxPlan& plan) {
  Status st;
  std::string close_reason;
  bool closed = false, noted = false;
  PathRxSettled moved;  // a path chunk moved at once (the small-chunk lane)
  DMX_TRACE_POINT("on_landed");
  {
    std::lock_guard<std::mutex> lock(mu_);
    DMX_TRACE_POINT("on_landed.locked");
    switch (h.type) {
      case FrameType::kEager:
        if (h.path != 0) st = on_path_header(stream, h, plan.control, &moved);
        else eager_landed(plan.host_tag, plan.ctx, h.payload_len);
        break;
      case FrameType::kRts: st = on_rts(h); break;
      case FrameType::kCts: st = on_cts(h); break;
      case FrameType::kSendData:
      case FrameType::kReadData:
      case FrameType::kWriteData:
        if (h.path != 0) st = on_path_header(stream, h, plan.control, &moved);
        else if (h.type == FrameType::kSendData)
          st = land_inbound(tokens_, h.id, h.payload_len, plan.host_tag == kTagCounted);
        else if (h.type == FrameType::kReadData)
          st = land_inbound(reads_, h.id, h.payload_len, plan.host_tag == kTagCounted);
        else {
          land_write(h, h.payload_len);
          noted = h.flags & wire::kFlagNotify;
        }
        break;
      case FrameType::kPathDone: {
        PathState* ps = h.a0 <= wire::kMaxPathId ? path_state(static_cast<uint8_t>(h.a0)) : nullptr;
        if (ps == nullptr || !ps->path->receiver_releases())
          st = protocol(fmt::format("PATH_DONE for path {}, which releases nothing here", h.a0));
        else if (!path_chunk_sent(ps->id, h.id, Status()))
          st = protocol(fmt::format("PATH_DONE for {} chunk {}, which is not in flight", ps->path->name(), h.id));
        break;
      }
      case FrameType::kReadReq: st = on_read_req(h); break;
      case FrameType::kAck: st = on_ack(h, plan.control); break;
      case FrameType::kCancel: st = on_cancel(h); break;
      case FrameType::kCredit:  // saturating: a peer's number must not wrap our credit round
        peer_credit_ = static_cast<int64_t>(std::min<uint64_t>(
            session_.peer_unexpected_budget,
            checked_add(static_cast<uint64_t>(std::max<int64_t>(peer_credit_, 0)), h.a0).value_or(UINT64_MAX)));
        break;
      case FrameType::kClose:
        closed = true;
        close_reason.assign(plan.control.begin(), plan.control.end());
        break;
      default:
        break;  // keepalive
    }
  }
  if (closed) end(Status(Code::kClosed, fmt::format("the peer closed the endpoint ({})", printable(close_reason))));
  if (noted || moved.noted) notes_cv_.notify_all();
  deliver();
  if (moved.release) send_path_done(moved.path, moved.seq);  // after the delivery, as on_path_rx_done
  return st;
}

void EndpointImpl::eager_landed(int host_tag, const std::shared_ptr<void>& ctx, uint64_t len, uint32_t via) {
  if (host_tag == kTagEagerMatched) {
    auto op = std::static_pointer_cast<OpState>(ctx);
    op->via |= via;
    op->done = len;
    --op->inflight;
    if (op->phase == OpPhase::kStopping) settle_stopped(op);
    else finish(*op, Status());
  } else if (host_tag == kTagEagerUnexpected) {
    auto u = std::static_pointer_cast<Unexpected>(ctx);
    u->landed = true;
    u->via = via;
    if (u->waiting) {
      auto op = u->waiting;
      Status s = consume_unexpected(u, op);
      if (!s.ok()) finish(*op, s);
    }
  }
}

Result<tcp::RxPlan> EndpointImpl::plan_eager(const FrameHeader& h, uint64_t len) {
  DMX_RETURN_IF_ERROR(check_new_msg(h.id));
  uint64_t cost = len + kEagerOverhead;
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    const auto& op = *it;
    if (op->posted_tag != kAnyTag && op->posted_tag != h.a0) continue;
    auto matched = op;
    posted_.erase(it);
    matched->tag = h.a0;
    matched->id = h.id;
    return_credit(cost);
    if (len > matched->region.size) {
      Status s(Code::kTruncated, fmt::format("a message of {} bytes does not fit the {}-byte receive buffer", len,
                                             matched->region.size));
      send_ack(h.id, wire::OpKind::kSend, s);
      finish(*matched, s);
      tcp::RxPlan p;
      p.kind = tcp::RxPlan::Kind::kDiscard;
      return p;
    }
    matched->phase = OpPhase::kActive;
    matched->total = len;
    ++matched->inflight;
    tcp::RxPlan p = plan_into(matched->region.sub(0, len), matched);
    p.host_tag = kTagEagerMatched;
    return p;
  }
  if (unexpected_bytes_ + cost > params_.unexpected_budget)
    return protocol(fmt::format("the peer sent more unexpected eager data than the {}-byte budget it was given",
                                params_.unexpected_budget));
  if (unexpected_.size() >= static_cast<size_t>(params_.max_inflight_ops))
    return protocol(fmt::format("the peer has more than {} unmatched messages in flight", params_.max_inflight_ops));
  auto u = std::make_shared<Unexpected>();
  u->msg = h.id;
  u->tag = h.a0;
  u->size = len;
  u->eager = true;
  u->data.resize(len);  // bounded by the eager limit (checked with the header) and the budget
  unexpected_bytes_ += cost;
  unexpected_.push_back(u);
  tcp::RxPlan p;
  p.kind = tcp::RxPlan::Kind::kHost;
  p.dst = u->data.data();
  p.ctx = u;
  p.host_tag = kTagEagerUnexpected;
  return p;
}

Status EndpointImpl::consume_unexpected(const std::shared_ptr<Unexpected>& u, const std::shared_ptr<OpState>& op) {
  std::erase(unexpected_, u);
  uint64_t cost = u->size + kEagerOverhead;
  unexpected_bytes_ -= cost;
  return_credit(cost);
  op->tag = u->tag;
  op->id = u->msg;
  op->via |= u->via;
  if (u->size > op->region.size) {
    Status s(Code::kTruncated,
             fmt::format("a message of {} bytes does not fit the {}-byte receive buffer", u->size, op->region.size));
    send_ack(u->msg, wire::OpKind::kSend, s);
    return s;
  }
  if (u->size > 0) DMX_RETURN_IF_ERROR(copy_memory(op->region.sub(0, u->size), MemRegion{u->data.data(), u->size, {}}));
  ++counters_.host_copies;
  counters_.host_copy_bytes += u->size;
  op->total = op->done = u->size;
  finish(*op, Status());
  return Status();
}

void EndpointImpl::return_credit(uint64_t bytes) {
  credit_owed_ += bytes;
  if (credit_owed_ >= std::max<uint64_t>(1, params_.unexpected_budget / 4)) {
    FrameHeader h;
    h.type = FrameType::kCredit;
    h.a0 = credit_owed_;
    push_control(h);
    credit_owed_ = 0;
  }
}

Status EndpointImpl::on_rts(const FrameHeader& h) {
  DMX_RETURN_IF_ERROR(check_new_msg(h.id));
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if ((*it)->posted_tag != kAnyTag && (*it)->posted_tag != h.a0) continue;
    auto op = *it;
    posted_.erase(it);
    accept_rendezvous(op, h.id, h.a1, h.a0);
    return Status();
  }
  if (unexpected_.size() >= static_cast<size_t>(params_.max_inflight_ops))
    return protocol(fmt::format("the peer has more than {} unmatched messages in flight", params_.max_inflight_ops));
  auto u = std::make_shared<Unexpected>();
  u->msg = h.id;
  u->tag = h.a0;
  u->size = h.a1;
  u->landed = true;
  unexpected_.push_back(u);
  return Status();
}

void EndpointImpl::accept_rendezvous(const std::shared_ptr<OpState>& op, uint64_t msg, uint64_t size, uint64_t tag) {
  op->tag = tag;
  op->id = msg;
  if (size > op->region.size) {
    Status s(Code::kTruncated,
             fmt::format("a message of {} bytes does not fit the {}-byte receive buffer", size, op->region.size));
    send_ack(msg, wire::OpKind::kSend, s);
    finish(*op, s);
    return;
  }
  uint64_t token = next_token_++;
  tokens_[token] = Inbound{op, msg, size, 0, size};
  token_of_msg_[msg] = token;
  op->phase = OpPhase::kActive;
  op->total = size;
  FrameHeader h;
  h.type = FrameType::kCts;
  h.id = msg;
  h.a0 = token;
  h.a1 = accepts_for(op->region.where);
  push_control(h);
}

Status EndpointImpl::on_cts(const FrameHeader& h) {
  auto it = sends_.find(h.id);
  if (it == sends_.end()) {
    if (h.id < next_msg_) return Status();  // cancelled meanwhile; our CANCEL tells the receiver
    return protocol(fmt::format("CTS for message {} that was never announced", h.id));
  }
  auto op = it->second;
  if (op->phase != OpPhase::kPosted) return protocol(fmt::format("a second CTS for message {}", h.id));
  DMX_RETURN_IF_ERROR(check_accepts(h.a1, fmt::format("CTS for message {}", h.id)));
  op->phase = OpPhase::kActive;
  op->rkey = h.a0;  // the receiver's token, carried in every SEND_DATA
  tx_.push_back(Transfer{op, FrameType::kSendData, static_cast<const char*>(op->region.ptr), op->region.where});
  tx_.back().accepts = h.a1;
  has_tx_.store(true, std::memory_order_release);
  wake_streams();
  return Status();
}

Result<tcp::RxPlan> EndpointImpl::plan_inbound(std::unordered_map<uint64_t, Inbound>& map, const FrameHeader& h,
                                               uint64_t offset, uint64_t total, uint64_t len, std::string_view what) {
  auto it = map.find(h.id);
  if (it == map.end()) return protocol(fmt::format("{} for unknown id {}", what, h.id));
  Inbound& in = it->second;
  if (total != in.total)
    return protocol(fmt::format("{} announces a {}-byte transfer; {} bytes were agreed", what, total, in.total));
  if (offset > in.total || len > in.total - offset)
    return protocol(fmt::format("{} chunk [{}, +{}) lies outside the {}-byte transfer", what, offset, len, in.total));
  if (len > in.expected - in.reserved)
    return protocol(fmt::format("{}: the peer sent more than the {} bytes it announced", what, in.expected));
  in.reserved += len;
  OpState* op = in.op.get();
  if (op != nullptr && (op->phase == OpPhase::kActive || op->phase == OpPhase::kPosted)) {
    op->phase = OpPhase::kActive;
    ++op->inflight;
    tcp::RxPlan p = plan_into(op->region.sub(offset, len), nullptr);
    p.host_tag = kTagCounted;
    return p;
  }
  tcp::RxPlan p;
  p.kind = tcp::RxPlan::Kind::kDiscard;
  return p;
}

Status EndpointImpl::land_inbound(std::unordered_map<uint64_t, Inbound>& map, uint64_t key, uint64_t len,
                                  bool counted, const Status& moved) {
  auto it = map.find(key);
  if (it == map.end()) return Status(Code::kInternal, "landed chunk of a forgotten transfer");
  Inbound& in = it->second;
  in.received += len;
  std::shared_ptr<OpState> op = in.op;
  if (counted && op) {
    --op->inflight;
    if (moved.ok()) op->done += len;
    else stop(op, moved);
    if (op->phase == OpPhase::kStopping) settle_stopped(op);
  }
  if (in.received == in.expected) {
    if (op && op->phase == OpPhase::kActive) finish(*op, Status());
    if (&map == &tokens_) token_of_msg_.erase(in.msg);
    map.erase(it);
  }
  return Status();
}

Result<tcp::RxPlan> EndpointImpl::plan_write(const FrameHeader& h, uint64_t len) {
  auto it = in_writes_.find(h.id);
  if (it == in_writes_.end()) {
    if (in_writes_.size() >= static_cast<size_t>(params_.max_inflight_ops))
      return protocol(fmt::format("the peer has more than {} writes in flight", params_.max_inflight_ops));
    InWrite w;
    w.rkey = h.a0;
    w.total = w.expected = h.a2;
    w.notify = h.flags & wire::kFlagNotify;
    w.value = h.a3;
    w.reg = ctx_->acquire_registration(h.a0, weak_from_this());
    Status refused;
    if (w.reg && w.total > w.reg->region.size) {
      // Checked when the write starts: it could never fit, and must not hold the region meanwhile.
      Status s = protocol(fmt::format("write op {} of {} bytes cannot fit the {}-byte region of key 0x{:x}", h.id,
                                      w.total, w.reg->region.size, h.a0));
      ContextImpl::release_registration(*w.reg);
      return s;
    }
    if (!w.reg) {
      refused = Status(Code::kNotFound, fmt::format("write refused: unknown remote key 0x{:x}", h.a0));
    } else if (w.notify && notes_.size() >= params_.max_notifications) {
      // The application takes no notifications: refuse more rather than hold them without bound.
      refused = Status(Code::kResourceExhausted,
                       fmt::format("write refused: {} notifications wait for the application (max_notifications)",
                                   notes_.size()));
      ContextImpl::release_registration(*w.reg);
      w.reg.reset();
    }
    if (!refused.ok()) {
      DMX_RETURN_IF_ERROR(note_refusal(refused));
      send_ack(h.id, wire::OpKind::kWrite, refused);
    }
    it = in_writes_.emplace(h.id, std::move(w)).first;
  } else if (it->second.total == kUnknownTotal) {  // created by an early CANCEL
    it->second.total = h.a2;
    it->second.rkey = h.a0;
  }
  InWrite& w = it->second;
  if (h.a2 != w.total || h.a0 != w.rkey)
    return protocol(fmt::format("WRITE_DATA for op {} changed its key or length mid-transfer", h.id));
  if (len > w.expected - w.reserved)
    return protocol(fmt::format("write op {}: the peer sent more than the {} bytes it announced", h.id, w.expected));
  w.reserved += len;
  if (!w.reg || w.cancelled || w.withdrawn) {
    tcp::RxPlan p;
    p.kind = tcp::RxPlan::Kind::kDiscard;
    return p;
  }
  const MemRegion& r = w.reg->region;
  if (!range_fits(h.a1, len, r.size))
    return protocol(fmt::format("write of {} bytes at offset {} lies outside the {}-byte region of key 0x{:x}", len,
                                h.a1, r.size, h.a0));
  // All chunks of one write lie within `total` bytes of each other: a write cannot spread further.
  w.lo = std::min(w.lo, h.a1);
  w.hi = std::max(w.hi, h.a1 + len);
  if (w.hi - w.lo > w.total)
    return protocol(fmt::format("write op {} touched [{}, {}) of key 0x{:x}, more than its {} bytes", h.id, w.lo, w.hi,
                                h.a0, w.total));
  return plan_into(r.sub(h.a1, len), nullptr);
}

void EndpointImpl::land_write(const FrameHeader& h, uint64_t len, const Status& moved) {
  auto it = in_writes_.find(h.id);
  if (it == in_writes_.end()) return;
  InWrite& w = it->second;
  w.received += len;
  if (!moved.ok() && w.failed.ok()) w.failed = moved;
  if (w.withdrawn && w.reg && w.received == w.reserved) {  // the last byte into the region landed
    ContextImpl::release_registration(*w.reg);
    w.reg.reset();
  }
  if (w.received != w.expected) return;
  if (w.reg && !w.cancelled) {
    send_ack(h.id, wire::OpKind::kWrite, w.failed);
    if (w.notify && w.failed.ok()) notes_.push_back(Notification{w.value, w.rkey, w.total});
  }
  if (w.reg) ContextImpl::release_registration(*w.reg);
  in_writes_.erase(it);
}

Status EndpointImpl::on_read_req(const FrameHeader& h) {
  if (serving_.size() >= static_cast<size_t>(params_.max_inflight_ops))
    return protocol(fmt::format("the peer has more than {} reads in flight", params_.max_inflight_ops));
  if (serving_.count(h.id)) return protocol(fmt::format("READ_REQ {} while a read with that id is served", h.id));
  DMX_RETURN_IF_ERROR(check_accepts(h.a3, fmt::format("READ_REQ {}", h.id)));
  auto reg = ctx_->acquire_registration(h.a0, weak_from_this());
  if (!reg) {
    Status s(Code::kNotFound, fmt::format("read refused: unknown remote key 0x{:x}", h.a0));
    DMX_RETURN_IF_ERROR(note_refusal(s));
    send_ack(h.id, wire::OpKind::kRead, s);
    return Status();
  }
  const MemRegion& r = reg->region;
  if (!range_fits(h.a1, h.a2, r.size)) {
    ContextImpl::release_registration(*reg);
    return protocol(fmt::format("read of {} bytes at offset {} lies outside the {}-byte region of key 0x{:x}", h.a2,
                                h.a1, r.size, h.a0));
  }
  auto op = std::make_shared<OpState>();
  op->type = OpType::kReadResponse;
  op->phase = OpPhase::kActive;
  op->id = h.id;
  op->region = r.sub(h.a1, h.a2);
  op->total = h.a2;
  op->reg = std::move(reg);
  serving_[op->id] = op;
  tx_.push_back(Transfer{op, FrameType::kReadData, static_cast<const char*>(op->region.ptr), op->region.where});
  tx_.back().accepts = h.a3;
  has_tx_.store(true, std::memory_order_release);
  wake_streams();
  return Status();
}

Status EndpointImpl::on_ack(const FrameHeader& h, const std::vector<unsigned char>& text_bytes) {
  if (h.a0 > static_cast<uint64_t>(Code::kInternal)) return protocol(fmt::format("ACK with unknown status {}", h.a0));
  auto code = static_cast<Code>(h.a0);
  // The peer's words go into our errors and logs: escaped and capped.
  std::string text = printable(std::string_view(reinterpret_cast<const char*>(text_bytes.data()), text_bytes.size()));
  switch (static_cast<wire::OpKind>(h.a1)) {
    case wire::OpKind::kSend: {
      if (code == Code::kOk) return protocol("ACK(ok) for a send");
      auto it = sends_.find(h.id);
      if (it != sends_.end()) stop(it->second, Status(code, fmt::format("the receiver ended the message: {}", text)));
      return Status();  // eager or already finished: nothing to do
    }
    case wire::OpKind::kWrite: {
      auto it = writes_.find(h.id);
      if (it == writes_.end()) {
        if (h.id < next_op_) return Status();
        return protocol(fmt::format("ACK for write op {} that was never issued", h.id));
      }
      auto op = it->second;
      if (code == Code::kOk) {
        if (op->handed < op->total) return protocol(fmt::format("ACK for write op {} before all its data", h.id));
        writes_.erase(it);
        op->done = op->total;
        finish(*op, Status());
      } else {
        stop(op, Status(code, fmt::format("the target refused the write: {}", text)));
      }
      return Status();
    }
    case wire::OpKind::kRead: {
      auto it = reads_.find(h.id);
      if (it == reads_.end()) {
        if (h.id < next_op_) return Status();
        return protocol(fmt::format("ACK for read op {} that was never issued", h.id));
      }
      Inbound& in = it->second;
      if (code == Code::kOk) return protocol(fmt::format("ACK(ok) for read op {}", h.id));
      Status why(code, fmt::format("the target ended the read: {}", text));
      if (in.reserved == 0) {  // refused up front
        if (in.op) finish(*in.op, Status(code, fmt::format("the target refused the read: {}", text)));
        reads_.erase(it);
        return Status();
      }
      // Ended midway: the chunks already announced still arrive; nothing more comes.
      in.expected = in.reserved;
      if (in.op) stop(in.op, why);
      if (in.received == in.expected) reads_.erase(it);
      return Status();
    }
  }
  return protocol(fmt::format("ACK for unknown operation kind {}", h.a1));
}

Status EndpointImpl::on_cancel(const FrameHeader& h) {
  uint64_t handed = h.a0;
  switch (static_cast<wire::OpKind>(h.a1)) {
    case wire::OpKind::kSend: {
      for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
        if ((*it)->msg == h.id && !(*it)->eager) {
          unexpected_.erase(it);
          return Status();
        }
      }
      auto t = token_of_msg_.find(h.id);
      if (t == token_of_msg_.end()) {
        if (h.id <= highest_msg_) return Status();  // finished or refused already
        return protocol(fmt::format("CANCEL for message {} that was never announced", h.id));
      }
      uint64_t token = t->second;
      Inbound& in = tokens_[token];
      if (handed < in.reserved || handed > in.total)
        return protocol(fmt::format("CANCEL of message {} claims {} bytes sent; {} already arrived", h.id, handed,
                                    in.reserved));
      in.expected = handed;
      auto op = in.op;
      if (op && op->phase == OpPhase::kActive && handed == 0 && in.reserved == 0) {
        // Nothing of the message reached the buffer: the receive was never really used, so it
        // matches the next message instead of failing (as if the cancelled message never came).
        tokens_.erase(token);
        token_of_msg_.erase(h.id);
        op->phase = OpPhase::kPosted;
        op->total = op->region.size;
        op->tag = op->posted_tag;
        match_recv(op, /*front=*/true);
        return Status();
      }
      if (op && op->phase == OpPhase::kActive) {
        op->phase = OpPhase::kStopping;
        op->outcome = Status(Code::kCancelled,
                             fmt::format("the sender cancelled the message after {} of {} bytes", handed, in.total));
        settle_stopped(op);
      }
      if (in.received == in.expected) {
        tokens_.erase(token);
        token_of_msg_.erase(h.id);
      }
      return Status();
    }
    case wire::OpKind::kWrite: {
      auto it = in_writes_.find(h.id);
      if (it == in_writes_.end()) {
        if (handed == 0) return Status();
        if (in_writes_.size() >= static_cast<size_t>(params_.max_inflight_ops))
          return protocol(fmt::format("the peer has more than {} writes in flight", params_.max_inflight_ops));
        InWrite w;
        w.total = kUnknownTotal;
        w.expected = handed;
        w.cancelled = true;
        in_writes_.emplace(h.id, std::move(w));
        return Status();
      }
      InWrite& w = it->second;
      if (handed < w.reserved || handed > w.total)
        return protocol(fmt::format("CANCEL of write op {} claims {} bytes sent; {} already arrived", h.id, handed,
                                    w.reserved));
      w.expected = handed;
      w.cancelled = true;
      if (w.received == w.expected) {
        if (w.reg) ContextImpl::release_registration(*w.reg);
        in_writes_.erase(it);
      }
      return Status();
    }
    default:
      return protocol(fmt::format("CANCEL for unknown operation kind {}", h.a1));
  }
}

// The region `reg` was deregistered: the peer's writes into it and reads from it end now, with
// "not found" on the peer's side; each lets go of the region once no byte of it is still moving.
void EndpointImpl::withdraw(Registered& reg) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status why(Code::kNotFound,
               fmt::format("region 0x{:x} was deregistered by the target while the operation used it", reg.key));
    for (auto& [id, w] : in_writes_) {
      if (w.reg.get() != &reg || w.withdrawn) continue;
      w.withdrawn = true;
      if (!w.cancelled) send_ack(id, wire::OpKind::kWrite, why);  // a cancelled one was answered
      if (w.received == w.reserved) {  // no chunk is landing now
        ContextImpl::release_registration(*w.reg);
        w.reg.reset();
      }
    }
    std::vector<std::shared_ptr<OpState>> reads;
    for (auto& [id, op] : serving_)
      if (op->reg.get() == &reg) reads.push_back(op);
    for (auto& op : reads) stop(op, why);  // the reader gets ACK(not found) for what was not sent
  }
  wake_streams();
}

}  // namespace dmx
