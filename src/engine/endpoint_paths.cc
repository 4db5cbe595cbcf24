// Endpoint: chunks whose bytes travel on a payload path (payload_path.h). The headers and every
// decision stay with the streams; this file hands chunks to paths and takes their completions.
#include <fmt/format.h>

#include "core/log.h"
#include "core/trace.h"
#include "engine/endpoint_impl.h"

namespace dmx {

using wire::FrameHeader;
using wire::FrameType;

namespace {

uint8_t flag_of(PathKind k) {
  switch (k) {
    case PathKind::kShm: return wire::kFlagPathShm;
    case PathKind::kCudaIpc: return wire::kFlagPathCudaIpc;
    case PathKind::kDevmem: return wire::kFlagPathDevmem;
  }
  return 0;
}

PathKind kind_of(uint8_t flags) {
  if (flags & wire::kFlagPathCudaIpc) return PathKind::kCudaIpc;
  if (flags & wire::kFlagPathDevmem) return PathKind::kDevmem;
  return PathKind::kShm;
}

}  // namespace

// The path for a chunk from `src`: cuda_ipc for what it carries (device memory), then devmem when
// the peer's buffer accepts it, then shm, then none (inline on stream 0).
PayloadPath* EndpointImpl::path_for(const MemSpec& src, uint64_t accepts, uint8_t skip) const {
  for (PathKind k : {PathKind::kCudaIpc, PathKind::kDevmem, PathKind::kShm}) {
    const auto& p = paths_[static_cast<int>(k)].path;
    if (k == PathKind::kDevmem && (accepts & wire::kFlagPathDevmem) == 0) continue;
    if (skip & (1u << static_cast<int>(k))) continue;
    if (p && p->carries(src)) return p.get();
  }
  return nullptr;
}

uint64_t EndpointImpl::accepts_for(const MemSpec& dst) const {
  const auto& d = paths_[static_cast<int>(PathKind::kDevmem)].path;
  return d && d->accepts(dst) ? uint64_t{wire::kFlagPathDevmem} : 0;
}

Status EndpointImpl::check_accepts(uint64_t flags, std::string_view what) const {
  if (flags & ~wire::kAcceptPathFlags)
    return Status(Code::kProtocol, fmt::format("{} names unknown payload paths (0x{:x})", what, flags));
  if ((flags & wire::kFlagPathDevmem) && !paths_[static_cast<int>(PathKind::kDevmem)].path)
    return Status(Code::kProtocol, fmt::format("{} accepts the devmem path, which was not agreed", what));
  return Status();
}

Status EndpointImpl::post_path_chunk(PayloadPath* path, Transfer& t, uint64_t len, tcp::TxItem* out) {
  PathState& ps = paths_[static_cast<int>(path->kind())];
  OpState& op = *t.op;
  uint64_t seq = ps.tx_seq;
  DMX_TRACE_POINT("tx.export");
  // An eager message is one chunk; a transfer's chunk may be cut shorter by the path (cuda_ipc: at
  // the end of a cuMem block), the rest going in the next chunks.
  bool whole = t.type == FrameType::kEager;
  DMX_ASSIGN_OR_RETURN(std::vector<unsigned char> desc,
                       path->post_tx(seq, MemRegion{const_cast<char*>(t.src) + t.next, len, t.where}, whole));
  DMX_TRACE_POINT("tx.exported");
  if (desc.empty() || desc.size() > kMaxPathDescriptor)
    return Status(Code::kInternal, fmt::format("{} path made a {}-byte descriptor", path_name(path->kind()), desc.size()));
  if (!whole) {  // a whole chunk is all of it by the contract: no decode on the small-message path
    auto taken = path->chunk_length(desc);
    if (!taken.ok() || *taken == 0 || *taken > len)
      return Status(Code::kInternal, fmt::format("{} path took {} of a {} B chunk", path_name(path->kind()),
                                                 taken.ok() ? std::to_string(*taken) : taken.status().message(), len));
    len = *taken;
  }
  ++ps.tx_seq;
  ps.tx[seq] = PathState::Tx{t.op, len};
  out->header.flags |= flag_of(path->kind());
  out->header.payload_len = static_cast<uint32_t>(desc.size());
  out->owned = std::move(desc);
  out->src = out->owned.data();
  out->where = MemSpec{};
  out->len = out->owned.size();
  out->ctx = nullptr;  // the chunk is done when the path says so, not when the header is written
  t.next += len;
  t.emitted = true;
  op.handed += len;
  op.via |= static_cast<uint8_t>(1u << static_cast<int>(path->kind()));
  ++op.inflight;
  return Status();
}

Status EndpointImpl::on_path_header(int stream, const FrameHeader& h, const std::vector<unsigned char>& desc,
                                    PathRxSettled* now_done) {
  PathKind k = kind_of(h.flags);
  PathState& ps = paths_[static_cast<int>(k)];
  bool eager = h.type == FrameType::kEager;  // the whole message, copied out of the sender's memory
  if (!ps.path || (eager && !ps.path->receiver_releases()))
    return Status(Code::kProtocol, fmt::format("{} uses the {} path, which was not agreed{}", wire::describe(h),
                                               path_name(k), eager ? " or cannot carry eager messages" : ""));
  DMX_TRACE_POINT("path_hdr");
  // A sender keeps a few chunks per path in flight (kPathWindow); a peer that announces thousands
  // would grow this table without bound.
  if (ps.rx.size() >= static_cast<size_t>(params_.max_inflight_ops))
    return Status(Code::kProtocol, fmt::format("the peer has more than {} {} chunks in flight", params_.max_inflight_ops,
                                               path_name(k)));
  auto len = ps.path->chunk_length(desc);
  if (!len.ok()) return Status(Code::kProtocol, fmt::format("{}: {}", wire::describe(h), len.status().message()));
  if (eager && (*len == 0 || *len > params_.eager_limit))
    return Status(Code::kProtocol, fmt::format("{} announces {} bytes; an eager message has 1 to {}", wire::describe(h),
                                               *len, params_.eager_limit));
  Result<tcp::RxPlan> plan = eager                               ? plan_eager(h, *len)
                             : h.type == FrameType::kSendData ? plan_inbound(tokens_, h, h.a0, h.a1, *len, "SEND_DATA")
                             : h.type == FrameType::kReadData ? plan_inbound(reads_, h, h.a0, h.a1, *len, "READ_DATA")
                                                              : plan_write(h, *len);
  if (!plan.ok()) return plan.status();
  DMX_TRACE_POINT("path_hdr.planned");
  uint64_t seq = ps.rx_seq++;
  MemRegion dst{nullptr, *len, {}};
  if (plan->kind != tcp::RxPlan::Kind::kDiscard) dst = MemRegion{plan->dst, *len, plan->where};
  ps.rx[seq] = PathState::Rx{h, *len, plan->host_tag, plan->ctx};
  DMX_TRACE_POINT("path_hdr.post_rx");
  // The small-chunk lane only for a chunk with nothing behind it on its stream (this runs on that
  // stream's worker): a burst of chunks goes to the path's thread, whose copies overlap, instead
  // of being copied one after another by the worker that should be reading the rest of the burst.
  Result<bool> now = false;
  if (streams_[static_cast<size_t>(stream)]->rx_backlog()) {
    if (Status s = ps.path->post_rx(seq, desc, dst); !s.ok()) now = s;
  } else {
    now = ps.path->post_rx_now(seq, desc, dst);
  }
  if (!now.ok()) {
    const Status& s = now.status();
    ps.rx.erase(seq);
    // An eager message has no one to tell but this side: the endpoint fails. A chunk of a transfer
    // counts as arrived-but-failed, like a failed copy.
    if (eager)
      return Status(s.code(), fmt::format("an eager message by {} could not be taken: {}", path_name(k), s.message()));
    if (h.type == FrameType::kWriteData) land_write(h, *len, s);
    else return land_inbound(h.type == FrameType::kSendData ? tokens_ : reads_, h.id, *len, plan->host_tag != 0, s);
    return Status();
  }
  if (*now) {  // moved already (the small-chunk lane): settle it here, as on_path_rx_done would
    DMX_TRACE_POINT("rx.inline");
    *now_done = settle_path_rx(k, seq, Status());
    return now_done->status;
  }
  DMX_TRACE_POINT("rx.posted");
  return Status();
}

EndpointImpl::PathRxSettled EndpointImpl::settle_path_rx(PathKind path, uint64_t seq, const Status& s) {
  PathRxSettled out;
  PathState& ps = paths_[static_cast<int>(path)];
  auto it = ps.rx.find(seq);
  if (it == ps.rx.end()) return out;  // the endpoint failed meanwhile
  auto rx = std::move(it->second);
  ps.rx.erase(it);
  const FrameHeader& h = rx.header;
  if (h.type == FrameType::kEager) {
    // A failed copy of an eager message has no one to tell but this side: fail the endpoint.
    if (s.ok())
      eager_landed(rx.host_tag, rx.ctx, rx.len, static_cast<uint8_t>(1u << static_cast<int>(path)));
    else
      out.status =
          Status(s.code(), fmt::format("an eager message by {} was not copied: {}", path_name(path), s.message()));
  } else if (h.type == FrameType::kWriteData) {
    land_write(h, rx.len, s);
    out.noted = (h.flags & wire::kFlagNotify) != 0;
  } else {
    auto& inbound = h.type == FrameType::kSendData ? tokens_ : reads_;
    if (auto in = inbound.find(h.id); in != inbound.end() && in->second.op)
      in->second.op->via |= static_cast<uint8_t>(1u << static_cast<int>(path));
    out.status = land_inbound(inbound, h.id, rx.len, rx.host_tag != 0, s);
  }
  out.release = ps.path->receiver_releases() && status_.ok();
  out.path = path;
  out.seq = seq;
  return out;
}

void EndpointImpl::send_path_done(PathKind path, uint64_t seq) {
  FrameHeader done;
  done.type = FrameType::kPathDone;
  done.id = seq;
  done.a0 = static_cast<uint64_t>(path);
  push_reply(done);
}

PayloadPath* EndpointImpl::eager_path(const MemSpec& src) const {
  const auto& p = paths_[static_cast<int>(PathKind::kCudaIpc)].path;
  return p && p->receiver_releases() && p->carries(src) ? p.get() : nullptr;
}

bool EndpointImpl::path_chunk_sent(PathKind path, uint64_t seq, const Status& s) {
  PathState& ps = paths_[static_cast<int>(path)];
  auto it = ps.tx.find(seq);
  if (it == ps.tx.end()) return false;
  auto tx = std::move(it->second);
  ps.tx.erase(it);
  chunk_sent(tx.op, tx.len, s);
  streams_[0]->wake();  // the window has room again
  return true;
}

// A path names its peer its own way (shm: "pid N"); the operation names the endpoint's peer, as a
// stream's failure does, and a lost peer reads the same whichever path noticed.
Status EndpointImpl::chunk_failure(const Status& s) const {
  Status named = Status(s.code(), s.message()).with_peer(session_.peer);
  if (!s.origin().empty()) named = named.with_origin(s.origin());
  return as_lost_peer(named);
}

void EndpointImpl::on_path_tx_done(PathKind path, uint64_t seq, const Status& s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Not in flight any more: the endpoint failed meanwhile.
    if (!path_chunk_sent(path, seq, s.ok() ? s : chunk_failure(s))) return;
  }
  deliver();
}

void EndpointImpl::on_path_rx_done(PathKind path, uint64_t seq, const Status& s) {
  DMX_TRACE_POINT("rx.done");
  PathRxSettled settled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    DMX_TRACE_POINT("rx.done.locked");
    settled = settle_path_rx(path, seq, s.ok() ? s : chunk_failure(s));
    DMX_TRACE_POINT("rx.done.settled");
  }
  DMX_TRACE_POINT("rx.landed");
  if (!settled.status.ok()) fail(settled.status);
  if (settled.noted) notes_cv_.notify_all();
  deliver();
  // After the delivery: the receiver's completion is what a ping-pong waits for; the sender's
  // source can be released a moment later. (A failed endpoint's stopped stream drops it.)
  if (settled.release) send_path_done(path, seq);
}

void EndpointImpl::on_path_failed(PathKind path, const Status& s) {
  fail(Status(s.code(), fmt::format("the {} path failed: {}", path_name(path), s.message())).with_peer(session_.peer));
}

EndpointStats::PathUse EndpointImpl::path_use(const PayloadPath& p) {
  PathStats x = p.stats();
  EndpointStats::PathUse u;
  u.name = path_name(p.kind());
  u.detail = p.describe();
  u.chunks_sent = x.chunks_sent;
  u.chunks_received = x.chunks_received;
  u.bytes_sent = x.bytes_sent;
  u.bytes_received = x.bytes_received;
  u.host_copies = x.host_copies;
  u.device_copies = x.device_copies;
  u.chunks_inline = x.inline_copies;
  return u;
}

void EndpointImpl::on_path_stopped(PathKind path) {
  std::lock_guard<std::mutex> lock(mu_);
  paths_running_ &= static_cast<uint8_t>(~(1u << static_cast<int>(path)));
  paths_cv_.notify_all();  // under the lock: the waiter may destroy the endpoint right after
}

// Called once every stream has stopped, without mu_: each path stops and waits until it no longer
// uses user memory; then the paths are destroyed (their threads joined), so that when close()
// returns no path thread runs any more. Pending chunks are forgotten; fail_all() ends their
// operations. Paths are read under mu_ from then on (stats(), path_for) and may be null.
// A path that has not stopped by stop_timeout is left running (it may still use user memory and
// call our events; ~EndpointImpl joins it) and named in stop_error_, which close() returns.
void EndpointImpl::stop_paths() {
  std::unique_ptr<PayloadPath> dead[kPathKinds];
  for (auto& ps : paths_)  // without mu_: a stop may wait for copies whose completions take it
    if (ps.path) ps.path->stop();
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!paths_cv_.wait_for(lock, params_.stop_timeout, [&] { return paths_running_ == 0; })) {
      std::string names;
      for (int k = 0; k < kPathKinds; ++k)
        if (paths_running_ & (1u << k)) names += fmt::format("{}{}", names.empty() ? "" : ", ", path_name(PathKind(k)));
      stop_error_ = Status(Code::kTimeout, fmt::format("payload path {} did not stop within {} ms", names,
                                                       std::chrono::duration_cast<std::chrono::milliseconds>(
                                                           params_.stop_timeout).count()))
                        .with_peer(session_.peer);
      DMX_LOG_ERROR("endpoint to {}: {}", session_.peer, stop_error_.message());
    }
    for (int k = 0; k < kPathKinds; ++k) {
      paths_[k].tx.clear();  // a late event of a path still running finds nothing in flight
      paths_[k].rx.clear();
      if (paths_running_ & (1u << k)) continue;  // still running: kept until ~EndpointImpl joins it
      if (paths_[k].path) stopped_paths_.push_back(path_use(*paths_[k].path));  // stats stay readable
      dead[k] = std::move(paths_[k].path);
    }
  }
  for (auto& p : dead) p.reset();  // joins the path's thread (past its last event already)
}

}  // namespace dmx
