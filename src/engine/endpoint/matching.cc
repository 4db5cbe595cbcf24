// Endpoint: two-sided messages arriving: eager and unexpected messages, receives matching
// them, rendezvous (RTS/CTS) and credit. Every field from the peer is untrusted.
#include <fmt/format.h>

#include <algorithm>

#include "core/checked.h"
#include "core/crc32c.h"
#include "core/log.h"
#include "core/trace.h"
#include "engine/endpoint/endpoint_impl.h"
#include "engine/endpoint/internal.h"

namespace dmx {

using wire::FrameHeader;
using wire::FrameType;
using namespace endpoint;

// Matches a receive against the messages that arrived first, else queues it (at the front when it
// is being re-queued: it was posted before everything queued). Caller holds mu_.
void EndpointImpl::match_recv(const std::shared_ptr<OpState>& op, bool front) {
  uint64_t tag = op->posted_tag;
  std::shared_ptr<Unexpected> match;
  for (auto& u : unexpected_) {
    if (u->waiting == nullptr && (tag == kAnyTag || u->tag == tag)) {
      match = u;
      break;
    }
  }
  if (!match) {
    if (front) posted_.push_front(op);
    else posted_.push_back(op);
  } else if (!match->eager) {
    std::erase(unexpected_, match);
    accept_rendezvous(op, match->msg, match->size, match->tag);
  } else if (!match->landed) {
    match->waiting = op;  // completes when its payload lands
    op->phase = OpPhase::kActive;
  } else {
    Status s = consume_unexpected(match, op);
    if (!s.ok()) finish(*op, s);
  }
}

Status EndpointImpl::check_new_msg(uint64_t msg) {
  if (msg <= highest_msg_) return protocol(fmt::format("message id {} does not follow {}", msg, highest_msg_));
  highest_msg_ = msg;
  ++counters_.messages_received;
  return Status();
}

void EndpointImpl::eager_landed(int host_tag, const std::shared_ptr<void>& ctx, uint64_t len, const FrameHeader& h,
                                uint32_t via, const Status& integrity) {
  if (host_tag == kTagEagerMatched) {
    auto op = std::static_pointer_cast<OpState>(ctx);
    op->via |= via;
    op->done = len;
    op->crc_raw = crc32c::to_raw(h.crc, len);
    --op->inflight;
    Status scattered;
    if (!op->bounce.empty()) {
      if (integrity.ok() && op->phase != OpPhase::kStopping) scattered = copy_into(*op, 0, op->bounce.data(), len);
      op->bounce = {};
    }
    if (op->phase == OpPhase::kStopping) settle_stopped(op);
    else finish(*op, integrity.ok() ? scattered : integrity);
  } else if (host_tag == kTagEagerUnexpected) {
    auto u = std::static_pointer_cast<Unexpected>(ctx);
    u->landed = true;
    u->via = via;
    u->crc = h.crc;
    u->corrupt = integrity;
    if (u->waiting) {
      auto op = u->waiting;
      Status s = consume_unexpected(u, op);
      if (!s.ok()) finish(*op, s);
    }
  }
}

Result<stream::RxPlan> EndpointImpl::plan_eager(const FrameHeader& h, uint64_t len) {
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
      stream::RxPlan p;
      p.kind = stream::RxPlan::Kind::kDiscard;
      return p;
    }
    matched->phase = OpPhase::kActive;
    matched->total = len;
    matched->known_size.store(len, std::memory_order_relaxed);
    ++matched->inflight;
    MemRegion dst = matched->vec ? matched->vec->slice(0, len) : matched->region.sub(0, len);
    if (matched->vec && dst.ptr == nullptr && len > 0) {  // spans pieces: scattered once landed
      matched->bounce.resize(len);
      dst = MemRegion{matched->bounce.data(), len, {}};
    }
    stream::RxPlan p = plan_into(dst, matched);
    p.host_tag = kTagEagerMatched;
    return p;
  }
  if (unexpected_bytes_ + cost > params_.unexpected_budget)
    return protocol(fmt::format("the peer sent more unexpected eager data than the {}-byte budget it was given",
                                params_.unexpected_budget));
  if (unexpected_.size() >= static_cast<size_t>(params_.max_inflight_ops))
    return protocol(fmt::format("the peer has more than {} unmatched messages in flight", params_.max_inflight_ops));
  // Every endpoint's unexpected data shares the context's budget too: many endpoints of one peer,
  // each within its own budget, must not together exhaust the process.
  // Charged to the peer (its process, at a listener), not to this endpoint alone.
  const std::string& peer = session_.peer_key.empty() ? session_.peer : session_.peer_key;
  auto charge = MemoryBudget::take(ctx_->memory_budget(), cost, peer, "unexpected eager data");
  if (!charge.ok()) return charge.status();
  auto u = std::make_shared<Unexpected>();
  u->msg = h.id;
  u->tag = h.a0;
  u->size = len;
  u->eager = true;
  u->charge = std::move(*charge);
  u->data.resize(len);  // bounded by the eager limit (checked with the header) and the budget
  unexpected_bytes_ += cost;
  unexpected_.push_back(u);
  stream::RxPlan p;
  p.kind = stream::RxPlan::Kind::kHost;
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
  if (!u->corrupt.ok()) return u->corrupt;
  DMX_RETURN_IF_ERROR(copy_into(*op, 0, u->data.data(), u->size));
  ++counters_.host_copies;
  counters_.host_copy_bytes += u->size;
  op->total = op->done = u->size;
  op->crc_raw = crc32c::to_raw(u->crc, u->size);
  finish(*op, Status());
  return Status();
}

bool EndpointImpl::take_after_close(const std::shared_ptr<OpState>& op) {
  auto& queue = unexpected_.empty() ? leftover_ : unexpected_;  // before or after the streams stopped
  // The next message of the tag that had fully arrived. One that had not (a rendezvous, a payload
  // still on its way) failed at its sender too: it was never sent, so it is passed over.
  auto it = std::find_if(queue.begin(), queue.end(), [&](const std::shared_ptr<Unexpected>& u) {
    return (op->posted_tag == kAnyTag || u->tag == op->posted_tag) && u->eager && u->landed && !u->waiting;
  });
  if (it == queue.end()) return false;
  std::shared_ptr<Unexpected> u = *it;
  queue.erase(it);
  if (&queue == &unexpected_) unexpected_bytes_ -= u->size + kEagerOverhead;  // no credit: no one to tell
  op->tag = u->tag;
  op->id = u->msg;
  op->via |= u->via;
  Status s = u->corrupt;  // its bytes failed their checksum
  if (s.ok() && u->size > op->region.size)
    s = Status(Code::kTruncated,
               fmt::format("a message of {} bytes does not fit the {}-byte receive buffer", u->size, op->region.size));
  else if (s.ok())
    s = copy_into(*op, 0, u->data.data(), u->size);
  if (s.ok()) {
    ++counters_.host_copies;
    counters_.host_copy_bytes += u->size;
    op->total = op->done = u->size;
    op->crc_raw = crc32c::to_raw(u->crc, u->size);
  }
  finish(*op, s);
  return true;
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
  op->known_size.store(size, std::memory_order_relaxed);
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
  wake_for(tx_.back());
  return Status();
}

}  // namespace dmx
