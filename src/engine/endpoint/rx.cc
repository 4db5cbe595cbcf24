// Endpoint: frames arriving from the peer. Every field is untrusted: ids, sizes, offsets and
// keys are checked against what this side announced or registered before any byte moves; a
// violation is a protocol error that fails the endpoint (and names the peer).
#include <fmt/format.h>

#include "core/checked.h"
#include "core/log.h"
#include "core/trace.h"
#include "engine/endpoint/endpoint_impl.h"
#include "engine/endpoint/internal.h"

namespace dmx {

using wire::FrameHeader;
using wire::FrameType;
using namespace endpoint;

stream::RxPlan EndpointImpl::plan_into(const MemRegion& dst, std::shared_ptr<void> ctx, uint64_t transfer,
                                       size_t in_flight) const {
  stream::RxPlan p;
  p.kind = dst.where.is_device() ? stream::RxPlan::Kind::kDevice : stream::RxPlan::Kind::kHost;
  // A window of receives writes more than the cache holds: skip it from nt_receive_min. One receive
  // alone (a ping-pong) is likely read next, from cache: only from kBulkTransfer.
  p.bulk = transfer >= params_.nt_receive_min && (transfer >= stream::kBulkTransfer || in_flight > 1);
  p.dst = dst.ptr;
  p.where = dst.where;
  p.ctx = std::move(ctx);
  return p;
}

Result<stream::RxPlan> EndpointImpl::on_header(int stream, const FrameHeader& h) {
  std::lock_guard<std::mutex> lock(mu_);
  DMX_TRACE_POINT("on_header.locked");
  if (wire::carries_data(h.type)) DMX_RETURN_IF_ERROR(check_flag(h));
  switch (h.type) {
    case FrameType::kEager:
      if (h.path != 0) {  // the payload is the path's descriptor of the message
        if (stream != 0) return protocol(fmt::format("{} arrived on stream {}, not 0", wire::describe(h), stream));
        stream::RxPlan p;
        p.kind = stream::RxPlan::Kind::kControl;
        return p;
      }
      if (session_.multilink) {
        // Matched only once the whole frame has landed: if its stream dies under it, the frame
        // comes again on another (endpoint/control.cc) and must find the receive still posted.
        auto held = std::make_shared<std::vector<unsigned char>>(h.payload_len);  // ≤ the eager limit
        stream::RxPlan p;
        p.kind = stream::RxPlan::Kind::kHost;
        p.dst = held->data();
        p.ctx = held;
        p.host_tag = kTagEagerHeld;
        return p;
      }
      return plan_eager(h, h.payload_len);
    case FrameType::kSendData:
    case FrameType::kReadData:
    case FrameType::kWriteData:
      if (h.path != 0) {  // the payload is the path's descriptor of the chunk
        if (stream != 0) return protocol(fmt::format("{} arrived on stream {}, not 0", wire::describe(h), stream));
        stream::RxPlan p;
        p.kind = stream::RxPlan::Kind::kControl;
        return p;
      }
      if (h.flags & wire::kFlagTable) {  // an inline table (frame.cc): the table first (on_prefix)
        stream::RxPlan p;
        p.kind = stream::RxPlan::Kind::kControl;
        p.prefix = static_cast<uint32_t>(wire::inline_table_bytes(h));  // < payload_len (frame.cc)
        return p;
      }
      {
        auto plan = h.type == FrameType::kSendData   ? plan_inbound(tokens_, h, h.a0, h.a1, h.payload_len, "SEND_DATA")
                    : h.type == FrameType::kReadData ? plan_inbound(reads_, h, h.a0, h.a1, h.payload_len, "READ_DATA")
                                                     : plan_write(h, h.payload_len);
        if (plan.ok() && session_.multilink && stream != 0) link_planned(stream, h, *plan);
        return plan;
      }
    case FrameType::kReadReq:  // a table's entries (frame.cc allows a payload only then)
    case FrameType::kAck:
    case FrameType::kClose: {
      stream::RxPlan p;
      p.kind = stream::RxPlan::Kind::kControl;
      return p;
    }
    case FrameType::kHello:
    case FrameType::kAuth:
    case FrameType::kJoin:
    case FrameType::kWelcome:
    case FrameType::kReject:
      return protocol(fmt::format("handshake frame {} after the handshake", wire::frame_type_name(h.type)));
    default:
      return stream::RxPlan();  // no payload; handled in on_landed
  }
}

Status EndpointImpl::on_landed(int stream, const FrameHeader& h, stream::RxPlan& plan) {
  Status st;
  std::string close_reason;
  bool closed = false, noted = false;
  PathRxSettled moved;  // a path chunk moved at once (the small-chunk lane)
  DMX_TRACE_POINT("on_landed");
  {
    std::lock_guard<std::mutex> lock(mu_);
    DMX_TRACE_POINT("on_landed.locked");
    // An inline chunk's bytes that the stream checked: a mismatch fails its operation only.
    Status integrity = plan.crc_checked ? verify(h, plan.landed_crc) : Status();
    switch (h.type) {
      case FrameType::kEager:
        if (h.path != 0) st = on_path_header(stream, h, plan.control, &moved);
        else if (plan.host_tag == kTagEagerHeld) st = eager_held_landed(h, plan, integrity);
        else eager_landed(plan.host_tag, plan.ctx, h.payload_len, h, 0, integrity);
        break;
      case FrameType::kRts: st = on_rts(h); break;
      case FrameType::kCts: st = on_cts(h); break;
      case FrameType::kSendData:
      case FrameType::kReadData:
      case FrameType::kWriteData:
        if (h.path != 0) st = on_path_header(stream, h, plan.control, &moved);
        else if (h.type == FrameType::kSendData)
          st = land_inbound(tokens_, h, h.payload_len, plan.host_tag == kTagCounted || plan.host_tag == kTagBounced,
                            plan.host_tag == kTagBounced && integrity.ok() ? scatter(plan.ctx) : integrity);
        else if (h.type == FrameType::kReadData)
          st = land_inbound(reads_, h, h.payload_len - wire::inline_table_bytes(h), plan.host_tag == kTagCounted,
                            integrity);
        else {
          land_write(h, h.payload_len - wire::inline_table_bytes(h), integrity);
          noted = h.flags & wire::kFlagNotify;
        }
        if (h.path == 0 && session_.multilink && stream != 0) link_landed(stream, h);
        break;
      case FrameType::kLinkAck: st = on_link_ack(stream, h); break;
      case FrameType::kLinkDown: st = on_link_down(stream, h); break;
      case FrameType::kPathDone: {
        PathState* ps = h.a0 <= wire::kMaxPathId ? path_state(static_cast<uint8_t>(h.a0)) : nullptr;
        if (ps == nullptr || !ps->path->receiver_releases())
          st = protocol(fmt::format("PATH_DONE for path {}, which releases nothing here", h.a0));
        else if (!path_chunk_sent(ps->id, h.id, Status()))
          st = protocol(fmt::format("PATH_DONE for {} chunk {}, which is not in flight", ps->path->name(), h.id));
        break;
      }
      case FrameType::kReadReq: st = on_read_req(h, plan.control); break;
      case FrameType::kAck: st = on_ack(h, plan.control); break;
      case FrameType::kCancel: st = on_cancel(h); break;
      case FrameType::kCredit:  // saturating: a peer's number must not wrap our credit round
        peer_credit_ = static_cast<int64_t>(std::min<uint64_t>(
            session_.peer_unexpected_budget,
            checked_add(static_cast<uint64_t>(std::max<int64_t>(peer_credit_, 0)), h.a0).value_or(UINT64_MAX)));
        break;
      case FrameType::kClose:
        closed = true;
        peer_closed_ = status_.ok();  // not after our own close or a failure
        close_reason.assign(plan.control.begin(), plan.control.end());
        break;
      default:
        break;  // keepalive
    }
    if (st.ok()) ctl_landed(h);
  }
  if (closed) end(Status(Code::kClosed, fmt::format("the peer closed the endpoint ({})", printable(close_reason))));
  if (noted || moved.noted) notes_cv_.notify_all();
  deliver();
  dispatch_notes();
  if (moved.release) send_path_done(moved.path, moved.seq);  // after the delivery, as on_path_rx_done
  return st;
}

// An eager message read into a buffer of its own (several links): matched now, and copied to where
// plan_eager puts it. Caller holds mu_.
Status EndpointImpl::eager_held_landed(const FrameHeader& h, const stream::RxPlan& held, const Status& integrity) {
  auto bytes = std::static_pointer_cast<std::vector<unsigned char>>(held.ctx);
  DMX_ASSIGN_OR_RETURN(stream::RxPlan plan, plan_eager(h, h.payload_len));
  Status landed = integrity;
  if ((plan.kind == stream::RxPlan::Kind::kHost || plan.kind == stream::RxPlan::Kind::kDevice) && !bytes->empty()) {
    Status copied = copy_memory(MemRegion{plan.dst, bytes->size(), plan.where}, MemRegion{bytes->data(), bytes->size()});
    if (landed.ok()) landed = copied;
  }
  eager_landed(plan.host_tag, plan.ctx, h.payload_len, h, 0, landed);
  return Status();
}

Result<stream::RxPlan> EndpointImpl::plan_inbound(std::unordered_map<uint64_t, Inbound>& map, const FrameHeader& h,
                                                  uint64_t offset, uint64_t total, uint64_t len,
                                                  std::string_view what) {
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
    MemRegion dst = op->vec ? op->vec->slice(offset, len) : op->region.sub(offset, len);
    auto bounce = std::shared_ptr<Bounce>();
    if (op->vec && dst.ptr == nullptr && len > 0) {
      // A read's chunks follow its segments (the target serves them as this side cut them); a
      // message's chunks follow the sender's pieces, and one that spans pieces here lands in a
      // bounce buffer first (bounded by the chunk size), then is scattered.
      if (op->type != OpType::kRecv)
        return protocol(fmt::format("{} chunk [{}, +{}) spans segments of the vectored read", what, offset, len));
      bounce = std::make_shared<Bounce>();
      bounce->op = in.op;
      bounce->at = offset;
      bounce->bytes.resize(len);
      dst = MemRegion{bounce->bytes.data(), len, {}};
    }
    op->phase = OpPhase::kActive;
    ++op->inflight;
    stream::RxPlan p = plan_into(dst, bounce, in.total, map.size());
    p.host_tag = bounce ? kTagBounced : kTagCounted;
    return p;
  }
  stream::RxPlan p;
  p.kind = stream::RxPlan::Kind::kDiscard;
  return p;
}

Status EndpointImpl::land_inbound(std::unordered_map<uint64_t, Inbound>& map, const FrameHeader& h, uint64_t len,
                                  bool counted, const Status& moved) {
  auto it = map.find(h.id);
  if (it == map.end()) return Status(Code::kInternal, "landed chunk of a forgotten transfer");
  Inbound& in = it->second;
  in.received += len;
  std::shared_ptr<OpState> op = in.op;
  if (counted && op) {
    --op->inflight;
    if (moved.ok()) {
      op->done += len;
      if (session_.checksum) fold_chunk(*op, h.a0, len, h.crc);  // a0: the chunk's offset
    } else {
      stop(op, moved);
    }
    if (op->phase == OpPhase::kStopping) settle_stopped(op);
  }
  if (in.received == in.expected) {
    if (op && op->phase == OpPhase::kActive) finish(*op, Status());
    if (&map == &tokens_) token_of_msg_.erase(in.msg);
    map.erase(it);
  }
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
        // The ACK can overtake a path's word that it let go of the source (the bytes were copied
        // out before the target could have them): the write completes once that word came too,
        // so that no thread of this side still touches the caller's buffer.
        if (op->inflight == 0) finish(*op, Status());
        else op->acked = true;
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
        release_write(w);
        in_writes_.erase(it);
      }
      return Status();
    }
    default:
      return protocol(fmt::format("CANCEL for unknown operation kind {}", h.a1));
  }
}

}  // namespace dmx
