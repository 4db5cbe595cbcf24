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

// A vectored write's state at its first chunk (or the first after an early CANCEL), and every
// later chunk's check that the write keeps its form and length.
Result<EndpointImpl::InWrite*> EndpointImpl::open_vec_write(const FrameHeader& h) {
  auto it = in_writes_.find(h.id);
  if (it == in_writes_.end()) {
    if (in_writes_.size() >= static_cast<size_t>(params_.max_inflight_ops))
      return protocol(fmt::format("the peer has more than {} writes in flight", params_.max_inflight_ops));
    InWrite w;
    w.vec = true;
    w.total = w.expected = h.a2;
    w.notify = h.flags & wire::kFlagNotify;
    w.value = h.a3;
    if (w.notify && notes_.size() >= params_.max_notifications) {
      Status refused(Code::kResourceExhausted,
                     fmt::format("write refused: {} notifications wait for the application (max_notifications)",
                                 notes_.size()));
      DMX_RETURN_IF_ERROR(note_refusal(refused));
      send_ack(h.id, wire::OpKind::kWrite, refused);
      w.refused = true;
    }
    it = in_writes_.emplace(h.id, std::move(w)).first;
  } else if (it->second.total == kUnknownTotal) {  // created by an early CANCEL
    it->second.total = h.a2;
    it->second.rkey = h.a0;
    it->second.vec = true;
  }
  InWrite& w = it->second;
  if (!w.vec || (h.flags & wire::kFlagVector) == 0 || h.a2 != w.total)
    return protocol(fmt::format("WRITE_DATA for op {} changed its form or length mid-transfer", h.id));
  return &w;
}

Result<stream::RxPlan> EndpointImpl::plan_write(const FrameHeader& h, uint64_t len) {
  auto it = in_writes_.find(h.id);
  if ((h.flags & wire::kFlagVector) != 0 || (it != in_writes_.end() && it->second.vec)) {
    DMX_ASSIGN_OR_RETURN(InWrite * w, open_vec_write(h));
    return plan_vec_write(*w, h, len);
  }
  if (it != in_writes_.end() && it->second.total == kUnknownTotal) {  // created by an early CANCEL
    it->second.total = h.a2;
    it->second.rkey = h.a0;
  }
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

// Every key, offset and length of a vectored write's chunk is the peer's word: the key must be
// registered here and the chunk must fit its region. The regions stay held until the write ends
// (a write names few regions: the map holds each once).
Result<stream::RxPlan> EndpointImpl::plan_vec_write(InWrite& w, const FrameHeader& h, uint64_t len) {
  if (len > w.expected - w.reserved)
    return protocol(fmt::format("write op {}: the peer sent more than the {} bytes it announced", h.id, w.expected));
  w.reserved += len;
  stream::RxPlan discard;
  discard.kind = stream::RxPlan::Kind::kDiscard;
  if (len == 0 && w.total == 0) return discard;  // an empty list's one chunk (key 0)
  if (len == 0) return protocol(fmt::format("write op {}: an empty chunk of a {}-byte vectored write", h.id, w.total));
  if (w.refused || w.cancelled || w.withdrawn) return discard;
  Registered* reg = nullptr;
  if (auto r = w.regs.find(h.a0); r != w.regs.end()) {
    reg = r->second.get();
  } else if (auto got = ctx_->acquire_registration(h.a0, weak_from_this())) {
    if (w.regs.size() >= static_cast<size_t>(params_.max_inflight_ops)) {
      ContextImpl::release_registration(*got);
      return protocol(fmt::format("write op {} names more than {} regions", h.id, params_.max_inflight_ops));
    }
    reg = got.get();
    w.regs.emplace(h.a0, std::move(got));
  } else {
    Status refused(Code::kNotFound, fmt::format("write refused: unknown remote key 0x{:x}", h.a0));
    DMX_RETURN_IF_ERROR(note_refusal(refused));
    send_ack(h.id, wire::OpKind::kWrite, refused);
    w.refused = true;
    return discard;
  }
  const MemRegion& r = reg->region;
  if (!range_fits(h.a1, len, r.size))
    return protocol(fmt::format("vectored write op {}: a chunk of {} bytes at offset {} lies outside the {}-byte "
                                "region of key 0x{:x}",
                                h.id, len, h.a1, r.size, h.a0));
  return plan_into(r.sub(h.a1, len), nullptr, w.total);
}

void EndpointImpl::release_write(InWrite& w) {
  if (w.reg) ContextImpl::release_registration(*w.reg);
  w.reg.reset();
  for (auto& [key, reg] : w.regs) ContextImpl::release_registration(*reg);
  w.regs.clear();
}

void EndpointImpl::land_write(const FrameHeader& h, uint64_t len, const Status& moved) {
  auto it = in_writes_.find(h.id);
  if (it == in_writes_.end()) return;
  InWrite& w = it->second;
  w.received += len;
  if (!moved.ok() && w.failed.ok()) w.failed = moved;
  if (w.vec) {
    if (w.withdrawn && w.received == w.reserved) release_write(w);
    if (w.received != w.expected) return;
    if (!w.refused && !w.cancelled && !w.withdrawn) {
      send_ack(h.id, wire::OpKind::kWrite, w.failed);
      if (w.notify && w.failed.ok()) notes_.push_back(Notification{w.value, 0, w.total});
    }
    release_write(w);
    in_writes_.erase(it);
    return;
  }
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

Status EndpointImpl::on_read_req(const FrameHeader& h, const std::vector<unsigned char>& table) {
  if (h.flags & wire::kFlagVector) return on_read_vec_req(h, table);
  if (vec_reads_.count(h.id)) return protocol(fmt::format("READ_REQ {} ends a vectored read unflagged", h.id));
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

// One segment of the peer's vectored read (READ_REQ with kFlagVector): checked against its region
// now, gathered until the last one (no kFlagMore), then served as one read. The segments a peer
// has announced are charged to the context's peer_memory_budget while they wait.
Status EndpointImpl::on_read_vec_req(const FrameHeader& h, const std::vector<unsigned char>& table) {
  auto it = vec_reads_.find(h.id);
  if (it == vec_reads_.end()) {
    if (serving_.size() + vec_reads_.size() >= static_cast<size_t>(params_.max_inflight_ops))
      return protocol(fmt::format("the peer has more than {} reads in flight", params_.max_inflight_ops));
    if (serving_.count(h.id)) return protocol(fmt::format("READ_REQ {} while a read with that id is served", h.id));
    DMX_RETURN_IF_ERROR(check_accepts(h.a3, fmt::format("READ_REQ {}", h.id)));
    it = vec_reads_.emplace(h.id, VecReadReq{}).first;
    it->second.accepts = h.a3;
  }
  VecReadReq& v = it->second;
  if (h.a3 != v.accepts) return protocol(fmt::format("vectored READ_REQ {} changed its accepting paths", h.id));
  if (h.flags & wire::kFlagTable) {
    const unsigned char* p = table.data();  // a0 entries: frame.cc checked the payload's size
    for (uint64_t k = 0; k < h.a0; ++k, p += wire::kTableEntrySize) {
      wire::TableEntry e = wire::get_table_entry(p);
      DMX_RETURN_IF_ERROR(add_read_segment(h.id, v, e.key, e.offset, e.length));
    }
  } else {
    DMX_RETURN_IF_ERROR(add_read_segment(h.id, v, h.a0, h.a1, h.a2));
  }
  if (h.flags & wire::kFlagMore) return Status();
  VecReadReq done = std::move(v);
  vec_reads_.erase(it);
  if (!done.refused.ok()) {
    for (auto& r : done.regs) ContextImpl::release_registration(*r);
    DMX_RETURN_IF_ERROR(note_refusal(done.refused));
    send_ack(h.id, wire::OpKind::kRead, done.refused);
    return Status();
  }
  auto op = std::make_shared<OpState>();
  op->type = OpType::kReadResponse;
  op->phase = OpPhase::kActive;
  op->id = h.id;
  op->region = MemRegion{nullptr, done.layout->total, done.layout->where};
  op->total = done.layout->total;
  op->vec = std::move(done.layout);
  op->regs = std::move(done.regs);
  serving_[op->id] = op;
  tx_.push_back(Transfer{op, FrameType::kReadData, nullptr, op->region.where});
  tx_.back().accepts = done.accepts;
  has_tx_.store(true, std::memory_order_release);
  wake_for(tx_.back());
  return Status();
}

Status EndpointImpl::add_read_segment(uint64_t id, VecReadReq& v, uint64_t key, uint64_t offset, uint64_t length) {
  VecLayout& l = *v.layout;
  if (++v.announced > kMaxIoEntries)
    return protocol(fmt::format("vectored read {} announces more than {} segments", id, kMaxIoEntries));
  if (v.refused.ok() && length > 0) {
    if (l.segs.size() % kVecChargeSegs == 0) {
      const std::string& peer = session_.peer_key.empty() ? session_.peer : session_.peer_key;
      auto charge = MemoryBudget::take(ctx_->memory_budget(), kVecChargeSegs * sizeof(VecSeg), peer,
                                       "a vectored read's segments");
      if (!charge.ok()) return charge.status();
      v.charges.push_back(std::move(*charge));
    }
    Registered* reg = nullptr;
    if (auto r = v.by_key.find(key); r != v.by_key.end()) {
      reg = r->second;
    } else if (auto got = ctx_->acquire_registration(key, weak_from_this())) {
      reg = got.get();
      v.by_key.emplace(key, reg);
      v.regs.push_back(std::move(got));
    } else {
      v.refused = Status(Code::kNotFound, fmt::format("read refused: unknown remote key 0x{:x}", key));
    }
    if (reg != nullptr) {
      const MemRegion& r = reg->region;
      if (!range_fits(offset, length, r.size))
        return protocol(fmt::format("vectored read {}: a segment of {} bytes at offset {} lies outside the {}-byte "
                                    "region of key 0x{:x}",
                                    id, length, offset, r.size, key));
      auto total = checked_add(l.total, length);
      if (!total) return protocol(fmt::format("vectored read {} exceeds 2^64 bytes", id));
      if (l.segs.empty()) l.where = r.where;
      if (!(r.where == l.where))
        v.refused = Status(Code::kInvalidArgument,
                           fmt::format("read refused: its regions are of different memory kinds ({}, {})",
                                       to_string(l.where), to_string(r.where)));
      l.segs.push_back(VecSeg{l.total, static_cast<char*>(r.ptr) + offset, length, 0, 0});
      l.total = *total;
    }
  }
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
      bool uses = w.reg.get() == &reg || (w.vec && w.regs.count(reg.key) && w.regs[reg.key].get() == &reg);
      if (!uses || w.withdrawn) continue;
      w.withdrawn = true;
      if (!w.cancelled && !w.refused) send_ack(id, wire::OpKind::kWrite, why);  // a cancelled one was answered
      if (w.received == w.reserved) release_write(w);  // no chunk is landing now
    }
    std::vector<std::shared_ptr<OpState>> reads;
    for (auto& [id, op] : serving_) {
      bool uses = op->reg.get() == &reg;
      for (const auto& r : op->regs) uses = uses || r.get() == &reg;
      if (uses) reads.push_back(op);
    }
    // A vectored read still gathering its segments: refused when its last one comes.
    for (auto& [id, v] : vec_reads_) {
      if (!v.by_key.count(reg.key) || v.by_key[reg.key] != &reg) continue;
      v.refused = why;  // no byte moved yet: let go of every region now
      for (auto& r : v.regs) ContextImpl::release_registration(*r);
      v.regs.clear();
      v.by_key.clear();
      v.layout->segs.clear();
    }
    for (auto& op : reads) stop(op, why);  // the reader gets ACK(not found) for what was not sent
  }
  wake_streams();
}

}  // namespace dmx
