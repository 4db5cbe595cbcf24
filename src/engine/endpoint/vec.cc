// Endpoint: vectored operations posted. A list is checked and laid out first (vec_list.cc); its
// segments then move as one operation.
#include <algorithm>
#include <cstring>

#include "core/checked.h"
#include "core/copy_crew.h"
#include "engine/endpoint/endpoint_impl.h"
#include "engine/endpoint/internal.h"
#include "engine/op.h"

namespace dmx {

using wire::FrameHeader;
using wire::FrameType;
using namespace endpoint;

Request EndpointImpl::refuse_vec(OpType type, const VecBuild& b, const OpOptions& o) {
  auto op = new_op(type, MemRegion{}, o);
  op->failed_entry = b.bad;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Request r = start(op, type == OpType::kRecv ? received_ : initiated_);
    finish(*op, b.status.with_peer(session_.peer));
  }
  deliver();
  return Request(op);
}

Request EndpointImpl::post_write_vec(std::span<const MemRegion> local, std::span<const RemoteRegion> remote,
                                     std::span<const IoEntry> entries, OpOptions o) {
  VecBuild b = build_one_sided(local, remote, entries, /*write=*/true, ctx_->list_crew());
  if (!b.status.ok()) return refuse_vec(OpType::kWrite, b, o);
  const VecLayout& l = *b.layout;
  if (l.segs.size() == 1) {  // one contiguous range: a plain write
    const VecSeg& s = l.segs[0];
    return post_one_sided(OpType::kWrite, MemRegion{s.local, s.length, l.where},
                          RemoteRegion{s.rkey, s.roffset + s.length}, s.roffset, std::move(o));
  }
  // Several segments, or none (an empty write: one empty chunk, which carries the notification).
  auto op = new_op(OpType::kWrite, MemRegion{nullptr, l.total, l.where}, o);
  op->vec = std::move(b.layout);
  op->notify = o.notify;
  op->notify_value = o.notify_value;
  std::unique_lock<std::mutex> lock(mu_);
  Request r = start(op, initiated_);
  if (!status_.ok()) {
    finish(*op, status_);
  } else {
    op->id = next_op_++;
    op->phase = OpPhase::kActive;
    ++counters_.writes;
    writes_[op->id] = op;
    tx_.push_back(Transfer{op, FrameType::kWriteData, nullptr, op->region.where});
    tx_.back().accepts = write_accepts();  // as a plain write: paths that land writes take it (devmem)
    has_tx_.store(true, std::memory_order_release);
    wake_for(tx_.back());
  }
  lock.unlock();
  deliver();
  return r;
}

Request EndpointImpl::post_read_vec(std::span<const MemRegion> local, std::span<const RemoteRegion> remote,
                                    std::span<const IoEntry> entries, OpOptions o) {
  VecBuild b = build_one_sided(local, remote, entries, /*write=*/false, ctx_->list_crew());
  if (!b.status.ok()) return refuse_vec(OpType::kRead, b, o);
  const VecLayout& l = *b.layout;
  if (l.segs.size() == 1) {
    const VecSeg& s = l.segs[0];
    return post_one_sided(OpType::kRead, MemRegion{s.local, s.length, l.where},
                          RemoteRegion{s.rkey, s.roffset + s.length}, s.roffset, std::move(o));
  }
  // Built before the lock is taken: the frames need only the operation's id.
  std::vector<ControlFrame> frames = read_req_frames(l, ctx_->list_crew());
  auto op = new_op(OpType::kRead, MemRegion{nullptr, l.total, l.where}, o);
  op->vec = std::move(b.layout);
  std::unique_lock<std::mutex> lock(mu_);
  Request r = start(op, initiated_);
  if (!status_.ok()) {
    finish(*op, status_);
  } else if (l.segs.empty()) {  // nothing to read: the peer need not hear of it
    finish(*op, Status());
  } else {
    op->id = next_op_++;
    ++counters_.reads;
    reads_[op->id] = Inbound{op, 0, l.total, 0, l.total};
    const uint64_t accepts = accepts_for(l.where);
    for (auto& [h, payload] : frames) {
      h.type = FrameType::kReadReq;
      h.id = op->id;
      h.a3 = accepts;
      push_control(h, std::move(payload));
    }
  }
  lock.unlock();
  deliver();
  return r;
}

std::vector<ControlFrame> endpoint::read_req_frames(const VecLayout& l, CopyCrew* crew) {
  struct Span {
    size_t first, n;  // n == 0: the segment at `first`, too long for an entry, alone
  };
  std::vector<Span> spans;
  for (size_t k = 0; k < l.segs.size();) {
    size_t end = k;
    while (end < l.segs.size() && end - k < wire::kMaxTableEntries && l.segs[end].length <= UINT32_MAX) ++end;
    spans.push_back({k, end - k});
    k = end == k ? k + 1 : end;
  }
  std::vector<ControlFrame> frames(spans.size());
  auto fill = [&](size_t i) {
    const Span& s = spans[i];
    FrameHeader& h = frames[i].first;
    h.flags = wire::kFlagVector | (i + 1 < spans.size() ? wire::kFlagMore : 0);
    if (s.n == 0) {
      const VecSeg& g = l.segs[s.first];
      h.a0 = g.rkey;
      h.a1 = g.roffset;
      h.a2 = g.length;
      return;
    }
    h.flags |= wire::kFlagTable;
    h.a0 = s.n;
    std::vector<unsigned char>& table = frames[i].second;
    table.resize(s.n * wire::kTableEntrySize);
    h.payload_len = static_cast<uint32_t>(table.size());
    unsigned char* p = table.data();
    for (size_t k = s.first; k < s.first + s.n; ++k, p += wire::kTableEntrySize)
      wire::put_table_entry(p, {l.segs[k].rkey, l.segs[k].roffset, static_cast<uint32_t>(l.segs[k].length)});
  };
  if (crew != nullptr && l.segs.size() >= kCrewEntries) {  // run() alone when it has no helpers
    crew->run(frames.size(), fill);
  } else {
    for (size_t i = 0; i < frames.size(); ++i) fill(i);
  }
  return frames;
}

Request EndpointImpl::post_send_vec(std::span<const MemRegion> regions, std::span<const IoPiece> pieces,
                                    uint64_t tag, OpOptions o) {
  VecBuild b = build_pieces(regions, pieces, /*recv=*/false);
  if (!b.status.ok()) return refuse_vec(OpType::kSend, b, o);
  const VecLayout& l = *b.layout;
  if (l.segs.size() <= 1) {
    MemRegion src{l.segs.empty() ? nullptr : l.segs[0].local, l.total, l.where};
    return post_send(src, tag, std::move(o));
  }
  MemRegion src{nullptr, l.total, l.where};
  auto op = new_op(OpType::kSend, src, o);
  op->vec = std::move(b.layout);
  return post_send_op(op, src, tag);
}

Request EndpointImpl::post_recv_vec(std::span<const MemRegion> regions, std::span<const IoPiece> pieces,
                                    uint64_t tag, OpOptions o) {
  VecBuild b = build_pieces(regions, pieces, /*recv=*/true);
  if (!b.status.ok()) return refuse_vec(OpType::kRecv, b, o);
  const VecLayout& l = *b.layout;
  if (l.segs.size() <= 1) {
    MemRegion dst{l.segs.empty() ? nullptr : l.segs[0].local, l.total, l.where};
    return post_recv(dst, tag, std::move(o));
  }
  MemRegion dst{nullptr, l.total, l.where};
  auto op = new_op(OpType::kRecv, dst, o);
  op->vec = std::move(b.layout);
  op->posted_tag = tag;
  return post_recv_op(op, dst);
}

const char* EndpointImpl::chunk_src(Transfer& t, uint64_t* room) const {
  const OpState& op = *t.op;
  if (!op.vec) {
    *room = op.total - t.next;
    return t.src + t.next;
  }
  const auto& segs = op.vec->segs;
  if (segs.empty()) {
    *room = 0;
    return nullptr;
  }
  while (t.seg + 1 < segs.size() && segs[t.seg].at + segs[t.seg].length <= t.next) ++t.seg;
  const VecSeg& s = segs[t.seg];
  *room = s.at + s.length - t.next;
  return s.local + (t.next - s.at);
}

Status EndpointImpl::copy_into(const OpState& op, uint64_t at, const void* src, uint64_t len) {
  if (len == 0) return Status();
  if (!op.vec) return copy_memory(op.region.sub(at, len), MemRegion{const_cast<void*>(src), len, {}});
  const VecLayout& l = *op.vec;
  if (!range_fits(at, len, l.total)) return Status(Code::kInternal, "copy past a vectored receive's end");
  const auto* from = static_cast<const unsigned char*>(src);
  for (size_t k = l.find(at); len > 0; ++k) {
    const VecSeg& s = l.segs[k];
    uint64_t in = at - s.at, n = std::min(len, s.length - in);
    if (l.where.is_device()) {
      DMX_RETURN_IF_ERROR(copy_memory(MemRegion{s.local + in, n, l.where}, MemRegion{const_cast<unsigned char*>(from), n, {}}));
    } else {
      std::memcpy(s.local + in, from, n);
    }
    from += n;
    at += n;
    len -= n;
  }
  return Status();
}

}  // namespace dmx

namespace dmx::endpoint {
bool vec_write(const OpState& op) { return op.vec != nullptr && op.type == OpType::kWrite; }
}  // namespace dmx::endpoint

namespace dmx {
Status EndpointImpl::scatter(const std::shared_ptr<void>& ctx) {
  auto b = std::static_pointer_cast<Bounce>(ctx);
  return copy_into(*b->op, b->at, b->bytes.data(), b->bytes.size());
}
}  // namespace dmx
