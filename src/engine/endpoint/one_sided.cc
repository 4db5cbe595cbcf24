// Endpoint: the target side of the peer's one-sided operations (writes landing in registered
// regions, reads served from them) and deregistration. Every key, offset and length from the peer
// is checked against what this side registered before any byte moves.
#include <fmt/format.h>

#include "core/checked.h"
#include "core/log.h"
#include "engine/endpoint/endpoint_impl.h"
#include "engine/endpoint/internal.h"

namespace dmx {

using wire::FrameHeader;
using wire::FrameType;
using namespace endpoint;

Result<stream::RxPlan> EndpointImpl::plan_write(const FrameHeader& h, uint64_t len) {
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
    stream::RxPlan p;
    p.kind = stream::RxPlan::Kind::kDiscard;
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
  return plan_into(r.sub(h.a1, len), nullptr, w.total);
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
  wake_for(tx_.back());
  return Status();
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
