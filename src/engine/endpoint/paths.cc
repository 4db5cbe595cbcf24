// Endpoint: chunks whose bytes travel on a payload path (transport/path.h). The headers and every
// decision stay with the streams; this file hands chunks to paths and takes their completions.
#include <fmt/format.h>

#include <algorithm>

#include "core/log.h"
#include "core/trace.h"
#include "engine/endpoint/endpoint_impl.h"
#include "engine/endpoint/internal.h"

namespace dmx {

using wire::FrameHeader;
using wire::FrameType;
using namespace endpoint;

namespace {

// Routes one path's events to the endpoint with the path's id.
class PathEvents final : public PayloadPath::Events {
 public:
  PathEvents(EndpointImpl* ep, uint8_t id) : ep_(ep), id_(id) {}
  void on_path_tx_done(uint64_t seq, const Status& s) override { ep_->on_path_tx_done(id_, seq, s); }
  void on_path_rx_done(uint64_t seq, const Status& s) override { ep_->on_path_rx_done(id_, seq, s); }
  void on_path_failed(const Status& s) override { ep_->on_path_failed(id_, s); }
  void on_path_stopped() override { ep_->on_path_stopped(id_); }

 private:
  EndpointImpl* const ep_;
  const uint8_t id_;
};

}  // namespace

std::unique_ptr<PayloadPath::Events> EndpointImpl::events_for(uint8_t id) {
  return std::make_unique<PathEvents>(this, id);
}

EndpointImpl::PathState* EndpointImpl::path_state(uint8_t id) {
  if (id == 0 || id > paths_.size() || !paths_[id - 1].path) return nullptr;
  return &paths_[id - 1];
}

// The first path in the session's ranking for this kind (engine/ranking.h) that carries `src` and
// reaches the buffer; null (inline) when the streams rank above every such path. Without a
// ranking, the first in path-id order.
EndpointImpl::PathState* EndpointImpl::path_for(const MemSpec& src, uint64_t accepts, uint32_t skip) {
  auto usable = [&](PathState& ps) {
    if (!ps.path || (skip & path_bit(ps.id))) return false;
    if (!ps.path->accepts_any() && (accepts & path_bit(ps.id)) == 0) return false;
    return ps.path->carries(src);
  };
  if (session_.ranking) {
    auto ranked = session_.ranking->rank(src);
    for (const RankedPath& r : ranked->order) {
      if (r.id == 0) return nullptr;  // the streams rank above what is left
      if (PathState* ps = path_state(r.id); ps != nullptr && usable(*ps)) return ps;
    }
    return nullptr;
  }
  for (auto& ps : paths_)
    if (usable(ps)) return &ps;
  return nullptr;
}

uint64_t EndpointImpl::accepts_for(const MemSpec& dst) const {
  uint64_t bits = 0;
  for (const auto& ps : paths_)
    if (ps.path && !ps.path->accepts_any() && ps.path->accepts(dst)) bits |= path_bit(ps.id);
  return bits;
}

uint64_t EndpointImpl::write_accepts() const {
  uint64_t bits = 0;
  for (const auto& ps : paths_)
    if (ps.path && !ps.path->accepts_any() && ps.path->lands_writes()) bits |= path_bit(ps.id);
  return bits;
}

Status EndpointImpl::check_accepts(uint64_t bits, std::string_view what) const {
  uint64_t known = 0;
  for (const auto& ps : paths_)
    if (ps.path && !ps.path->accepts_any()) known |= path_bit(ps.id);
  if (bits & ~known)
    return Status(Code::kProtocol,
                  fmt::format("{} names payload paths that were not agreed or reach any buffer (0x{:x})", what, bits));
  return Status();
}

Status EndpointImpl::post_path_chunk(PathState& ps, Transfer& t, uint64_t len, stream::TxItem* out) {
  PayloadPath* path = ps.path.get();
  OpState& op = *t.op;
  uint64_t seq = ps.tx_seq;
  DMX_TRACE_POINT("tx.export");
  // An eager message is one chunk; a transfer's chunk may be cut shorter by the path (cuda_ipc: at
  // the end of a cuMem block), the rest going in the next chunks.
  bool whole = t.type == FrameType::kEager;
  uint64_t room = 0;
  char* src = const_cast<char*>(chunk_src(t, &room));
  DMX_ASSIGN_OR_RETURN(std::vector<unsigned char> desc, path->post_tx(seq, MemRegion{src, len, t.where}, whole));
  DMX_TRACE_POINT("tx.exported");
  if (desc.empty() || desc.size() > kMaxPathDescriptor)
    return Status(Code::kInternal, fmt::format("{} path made a {}-byte descriptor", path->name(), desc.size()));
  if (!whole) {  // a whole chunk is all of it by the contract: no decode on the small-message path
    auto taken = path->chunk_length(desc);
    if (!taken.ok() || *taken == 0 || *taken > len)
      return Status(Code::kInternal, fmt::format("{} path took {} of a {} B chunk", path->name(),
                                                 taken.ok() ? std::to_string(*taken) : taken.status().message(), len));
    len = *taken;
  }
  DMX_RETURN_IF_ERROR(stamp_path_chunk(MemRegion{src, len, t.where}, &out->header));
  if (session_.checksum && !vec_write(op)) fold_chunk(op, chunk_offset(op, out->header), len, out->header.crc);
  ++ps.tx_seq;
  ps.tx[seq] = PathState::Tx{t.op, len};
  out->header.path = ps.id;
  out->header.payload_len = static_cast<uint32_t>(desc.size());
  out->owned = std::move(desc);
  out->src = out->owned.data();
  out->where = MemSpec{};
  out->len = out->owned.size();
  out->ctx = nullptr;  // the chunk is done when the path says so, not when the header is written
  t.next += len;
  t.emitted = true;
  op.handed += len;
  op.via |= path_bit(ps.id);
  ++op.inflight;
  return Status();
}

Status EndpointImpl::on_path_header(int stream, const FrameHeader& h, const std::vector<unsigned char>& desc,
                                    PathRxSettled* now_done) {
  PathState* found = path_state(h.path);
  bool eager = h.type == FrameType::kEager;  // the whole message, copied out of the sender's memory
  if (!found || (eager && !found->path->receiver_releases())) {
    bool pathless = h.path >= 1 && h.path <= session_.agreed.size();  // agreed, but it makes no path
    return Status(Code::kProtocol, fmt::format("{} uses path {}, {}{}", wire::describe(h), h.path,
                                               pathless && !found ? fmt::format("whose transport ({}) makes no path",
                                                                                session_.agreed[h.path - 1]->name())
                                                                  : "which was not agreed",
                                               eager ? " or cannot carry eager messages" : ""));
  }
  PathState& ps = *found;
  std::string_view name = ps.path->name();
  DMX_TRACE_POINT("path_hdr");
  // A sender keeps a few chunks per path in flight (kPathWindow, kSmallPathWindow); a peer that
  // announces thousands would grow this table without bound.
  size_t rx_bound = static_cast<size_t>(params_.max_inflight_ops);
  if (ps.path->receiver_releases()) rx_bound = std::max(rx_bound, kSmallPathWindow);
  if (ps.rx.size() >= rx_bound)
    return Status(Code::kProtocol, fmt::format("the peer has more than {} {} chunks in flight", rx_bound, name));
  if (h.flags & wire::kFlagTable) return on_table_header(ps, h, desc);
  auto len = ps.path->chunk_length(desc);
  if (!len.ok()) return Status(Code::kProtocol, fmt::format("{}: {}", wire::describe(h), len.status().message()));
  if (eager && (*len == 0 || *len > params_.eager_limit))
    return Status(Code::kProtocol, fmt::format("{} announces {} bytes; an eager message has 1 to {}", wire::describe(h),
                                               *len, params_.eager_limit));
  Result<stream::RxPlan> plan =
      eager                            ? plan_eager(h, *len)
      : h.type == FrameType::kSendData ? plan_inbound(tokens_, h, h.a0, h.a1, *len, "SEND_DATA")
      : h.type == FrameType::kReadData ? plan_inbound(reads_, h, h.a0, h.a1, *len, "READ_DATA")
                                       : plan_write(h, *len);
  if (!plan.ok()) return plan.status();
  DMX_TRACE_POINT("path_hdr.planned");
  uint64_t seq = ps.rx_seq++;
  MemRegion dst{nullptr, *len, {}};
  if (plan->kind != stream::RxPlan::Kind::kDiscard) dst = MemRegion{plan->dst, *len, plan->where};
  ps.rx[seq] = PathState::Rx{h, *len, plan->host_tag, plan->ctx, dst};
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
    const Status& refused = now.status();
    ps.rx.erase(seq);
    // An eager message has no one to tell but this side: the endpoint fails. A chunk of a transfer
    // counts as arrived-but-failed, like a failed copy.
    if (eager)
      return Status(refused.code(),
                    fmt::format("an eager message by {} could not be taken: {}", name, refused.message()));
    const Status s = chunk_failure(refused);
    Status landed;
    if (h.type == FrameType::kWriteData) land_write(h, *len, s);
    else landed = land_inbound(h.type == FrameType::kSendData ? tokens_ : reads_, h, *len, plan->host_tag != 0, s);
    // The path never took the chunk: the sender's memory is free again, and its window slot
    // (without PATH_DONE its operation would wait for the chunk for ever).
    if (landed.ok() && ps.path->receiver_releases()) send_path_done(ps.id, seq);
    return landed;
  }
  if (*now) {  // moved already (the small-chunk lane): settle it here, as on_path_rx_done would
    DMX_TRACE_POINT("rx.inline");
    Status integrity;
    if (session_.checksum && dst.ptr != nullptr) {  // small: checked under the lock
      auto landed = checksum_memory(dst.where, dst.ptr, dst.size, Deadline::after(std::chrono::seconds(30)));
      integrity = landed.ok() ? verify(h, *landed) : landed.status();
    }
    *now_done = settle_path_rx(ps.id, seq, integrity);
    return now_done->status;
  }
  DMX_TRACE_POINT("rx.posted");
  return Status();
}

EndpointImpl::PathRxSettled EndpointImpl::settle_path_rx(uint8_t path, uint64_t seq, const Status& s) {
  PathRxSettled out;
  PathState* found = path_state(path);
  if (found == nullptr) return out;  // stopped meanwhile
  PathState& ps = *found;
  auto it = ps.rx.find(seq);
  if (it == ps.rx.end()) return out;  // the endpoint failed meanwhile
  auto rx = std::move(it->second);
  ps.rx.erase(it);
  if (peer_closed_ && ps.rx.empty()) paths_cv_.notify_all();  // stop_paths may wait for this
  const FrameHeader& h = rx.header;
  if (h.type == FrameType::kEager) {
    // A failed copy of an eager message has no one to tell but this side: fail the endpoint.
    // Corrupt bytes fail the receive only, as inline ones do.
    if (s.ok() || s.code() == Code::kDataLoss)
      eager_landed(rx.host_tag, rx.ctx, rx.len, h, path_bit(path), s);
    else
      out.status =
          Status(s.code(), fmt::format("an eager message by {} was not copied: {}", ps.path->name(), s.message()));
  } else if (h.type == FrameType::kWriteData) {
    land_write(h, rx.len, s);
    out.noted = (h.flags & wire::kFlagNotify) != 0;
  } else {
    auto& inbound = h.type == FrameType::kSendData ? tokens_ : reads_;
    if (auto in = inbound.find(h.id); in != inbound.end() && in->second.op)
      in->second.op->via |= path_bit(path);
    out.status = land_inbound(inbound, h, rx.len, rx.host_tag != 0,
                              rx.host_tag == kTagBounced && s.ok() ? scatter(rx.ctx) : s);
  }
  out.release = ps.path->receiver_releases() && status_.ok();
  out.path = path;
  out.seq = seq;
  return out;
}

void EndpointImpl::send_path_done(uint8_t path, uint64_t seq) {
  FrameHeader done;
  done.type = FrameType::kPathDone;
  done.id = seq;
  done.a0 = path;
  push_reply(done);
}

// A path that releases at the receiver copies an eager message straight out of the sender's
// memory (no staging); the other paths' eager messages go inline.
EndpointImpl::PathState* EndpointImpl::eager_path(const MemSpec& src) {
  auto usable = [&](PathState& ps) { return ps.path && ps.path->receiver_releases() && ps.path->carries(src); };
  if (session_.ranking) {
    auto ranked = session_.ranking->rank(src);
    for (const RankedPath& r : ranked->order) {
      if (r.id == 0) return nullptr;
      if (PathState* ps = path_state(r.id); ps != nullptr && usable(*ps)) return ps;
    }
    return nullptr;
  }
  for (auto& ps : paths_)
    if (usable(ps)) return &ps;
  return nullptr;
}

bool EndpointImpl::path_chunk_sent(uint8_t path, uint64_t seq, const Status& s) {
  PathState* found = path_state(path);
  if (found == nullptr) return false;
  PathState& ps = *found;
  auto it = ps.tx.find(seq);
  if (it == ps.tx.end()) return false;
  auto tx = std::move(it->second);
  ps.tx.erase(it);
  DMX_TRACE_POINT("path.sent");
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

void EndpointImpl::on_path_tx_done(uint8_t path, uint64_t seq, const Status& s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Not in flight any more: the endpoint failed meanwhile.
    if (!path_chunk_sent(path, seq, s.ok() ? s : chunk_failure(s))) return;
  }
  deliver();
}

void EndpointImpl::on_path_rx_done(uint8_t path, uint64_t seq, const Status& s) {
  DMX_TRACE_POINT("rx.done");
  Status integrity;
  if (session_.checksum && s.ok()) {  // the landed bytes against the header, outside the lock
    FrameHeader h;
    MemRegion dst;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (PathState* ps = path_state(path))
        if (auto it = ps->rx.find(seq); it != ps->rx.end()) {
          h = it->second.header;
          dst = it->second.dst;
        }
    }
    if (dst.ptr != nullptr) integrity = verify_path_chunk(h, dst);
  }
  PathRxSettled settled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    DMX_TRACE_POINT("rx.done.locked");
    settled = settle_path_rx(path, seq, !s.ok() ? chunk_failure(s) : integrity);
    DMX_TRACE_POINT("rx.done.settled");
  }
  DMX_TRACE_POINT("rx.landed");
  if (!settled.status.ok()) fail(settled.status);
  if (settled.noted) notes_cv_.notify_all();
  deliver();
  dispatch_notes();
  // After the delivery: the receiver's completion is what a ping-pong waits for; the sender's
  // source can be released a moment later. (A failed endpoint's stopped stream drops it.)
  if (settled.release) send_path_done(path, seq);
}

void EndpointImpl::on_path_failed(uint8_t path, const Status& s) {
  std::string_view name = path <= session_.agreed.size() && path > 0 ? session_.agreed[path - 1]->name() : "?";
  fail(Status(s.code(), fmt::format("the {} path failed: {}", name, s.message())).with_peer(session_.peer));
}

EndpointStats::PathUse EndpointImpl::path_use(const PayloadPath& p) {
  PathStats x = p.stats();
  EndpointStats::PathUse u;
  u.name = std::string(p.name());
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

void EndpointImpl::on_path_stopped(uint8_t path) {
  std::lock_guard<std::mutex> lock(mu_);
  paths_running_ &= ~path_bit(path);
  paths_cv_.notify_all();  // under the lock: the waiter may destroy the endpoint right after
}

// Called once every stream has stopped, without mu_: each path stops and waits until it no longer
// uses user memory; then the paths are destroyed (their threads joined), so that when close()
// returns no path thread runs any more. Pending chunks are forgotten; fail_all() ends their
// operations. Paths are read under mu_ from then on (stats(), path_for) and may be null.
// A path that has not stopped by stop_timeout is left running (it may still use user memory and
// call our events; ~EndpointImpl joins it) and named in stop_error_, which close() returns.
void EndpointImpl::stop_paths() {
  std::vector<std::unique_ptr<PayloadPath>> dead(paths_.size());
  // The peer closed in order: chunks whose headers came before its CLOSE are in a path on their
  // way here, and their senders saw those sends complete. They land first (within stop_timeout,
  // while the path runs); stopping now would fail those receives. Whatever ends the wait
  // notifies paths_cv_: a path's last chunk settling, a path stopping, our own close().
  {
    std::unique_lock<std::mutex> lock(mu_);
    paths_cv_.wait_for(lock, params_.stop_timeout, [&] {
      if (!peer_closed_) return true;
      for (const auto& ps : paths_)
        if ((paths_running_ & path_bit(ps.id)) && !ps.rx.empty()) return false;
      return true;
    });
  }
  for (auto& ps : paths_)  // without mu_: a stop may wait for copies whose completions take it
    if (ps.path) ps.path->stop();
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!paths_cv_.wait_for(lock, params_.stop_timeout, [&] { return paths_running_ == 0; })) {
      std::string names;
      for (const auto& ps : paths_)
        if (paths_running_ & path_bit(ps.id)) names += fmt::format("{}{}", names.empty() ? "" : ", ", ps.path->name());
      stop_error_ = Status(Code::kTimeout, fmt::format("payload path {} did not stop within {} ms", names,
                                                       std::chrono::duration_cast<std::chrono::milliseconds>(
                                                           params_.stop_timeout).count()))
                        .with_peer(session_.peer);
      DMX_LOG_ERROR("endpoint to {}: {}", session_.peer, stop_error_.message());
    }
    for (size_t k = 0; k < paths_.size(); ++k) {
      PathState& ps = paths_[k];
      ps.tx.clear();  // a late event of a path still running finds nothing in flight
      ps.rx.clear();
      if (paths_running_ & path_bit(ps.id)) continue;  // still running: kept until ~EndpointImpl joins it
      if (ps.path) stopped_paths_.push_back(path_use(*ps.path));  // stats stay readable
      dead[k] = std::move(ps.path);
    }
  }
  for (auto& p : dead) p.reset();  // joins the path's thread (past its last event already)
}

}  // namespace dmx
