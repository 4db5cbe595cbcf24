// Endpoint: what the streams send. With a payload path agreed there is one stream, which pulls
// the next chunk of the oldest transfer, by the path when it carries the source (a path that
// cannot carry this particular source is passed over for that transfer; the chunk's header then
// goes in stream 0's control queue), else inline. Without one, the streams pull the chunks
// inline as the streams' transport's striping lets them (more than one stream; stream 0 alone
// otherwise). The streams report each frame written (on_sent), which completes eager sends and
// counts chunks.
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

// A vectored transfer's host segments smaller than this go inline on the streams, not by a path.
constexpr uint64_t kVecInlineSegment = 64 << 10;

// Transmit side: streams pull chunks of the oldest transfer first.
bool EndpointImpl::next_chunk(int stream, stream::TxItem* out) {
  if (!has_tx_.load(std::memory_order_acquire)) return false;  // idle streams poll without the lock
  // Without the lock: it runs on every pull. With a payload path there is one stream and no
  // striping (the paths' chunk headers keep their order on stream 0).
  if (striping_ && !striping_->pulls(stream)) return false;
  std::lock_guard<std::mutex> lock(mu_);
  struct Sync {  // keeps has_tx_ equal to !tx_.empty() on every return
    EndpointImpl* ep;
    ~Sync() { ep->has_tx_.store(!ep->tx_.empty() || !ep->resend_.empty(), std::memory_order_release); }
  } sync{this};
  if (session_.multilink && link_resend(stream, out)) return true;  // a dead link's chunks first
  while (!tx_.empty()) {
    Transfer& t = tx_.front();
    OpState& op = *t.op;
    // An empty transfer (one empty chunk) always goes inline: no path has anything to move. So
    // does a vectored transfer's small segment of host memory, unless a list takes it: a path's
    // chunk costs a descriptor and a hand-off to its thread each way, more than the stream's copy
    // of a few KiB. A vectored write's run of small segments goes as one table chunk to a path
    // that takes lists (endpoint/tables.cc).
    uint64_t room = 0;  // vectored: a chunk ends at its segment's end
    const char* src = chunk_src(t, &room);
    PathState* path = has_paths_ && op.total > 0 ? path_for(t.where, t.accepts, t.skip_paths) : nullptr;
    size_t pieces = path != nullptr ? list_pieces(*path, t) : 0;
    if (pieces <= 1 && op.vec && !t.where.is_device() && room < kVecInlineSegment) path = nullptr;
    uint64_t len = std::min<uint64_t>(path ? path->path->max_chunk() : inline_chunk(t), room);
    // A window per path keeps cancel effective and memory bounded; completions wake stream 0.
    if (path != nullptr && pieces > 1 &&
        path->tx.size() >= (path->path->receiver_releases() ? kListWindow : kPathWindow)) {
      DMX_TRACE_POINT("tbl.window");
      return false;
    }
    if (path != nullptr && pieces <= 1 && path->tx.size() >= kPathWindow &&
        !(len <= kSmallPathChunk && path->path->receiver_releases() &&
          path->tx.size() < std::min<size_t>(kSmallPathWindow, static_cast<size_t>(params_.max_inflight_ops))))
      return false;
    if (len == 0 && t.emitted) {
      tx_.pop_front();
      continue;
    }
    if (path == nullptr) {  // a run of small segments: one inline table chunk
      if (size_t n = inline_table_pieces(t, inline_chunk(t)); n > 1) {
        post_inline_table(t, n, out);
        if (session_.multilink) link_pulled(stream, out, &t);  // kept until the peer has it
        if (striping_) striping_->took(stream);
        if (t.next == op.total) tx_.pop_front();
        return true;
      }
    }
    FrameHeader& h = out->header;
    h.type = t.type;
    h.id = op.id;
    switch (t.type) {
      case FrameType::kSendData:  // id: the receiver's token
        h.id = op.rkey;
        h.a0 = t.next;
        h.a1 = op.total;
        break;
      case FrameType::kWriteData:
        h.a0 = op.rkey;
        h.a1 = op.roffset + t.next;
        h.a2 = op.total;
        h.a3 = op.notify_value;
        h.flags = op.notify ? wire::kFlagNotify : 0;
        if (op.vec) {  // each chunk names its own region (an empty list's one chunk: key 0)
          h.flags |= wire::kFlagVector;
          h.a0 = h.a1 = 0;
          if (!op.vec->segs.empty()) {
            const VecSeg& seg = op.vec->segs[t.seg];
            h.a0 = seg.rkey;
            h.a1 = seg.roffset + (t.next - seg.at);
          }
        }
        break;
      default:  // kReadData
        h.a0 = t.next;
        h.a1 = op.total;
        break;
    }
    if (path != nullptr && pieces > 1) {
      Status st = post_path_list(*path, t, pieces, out);
      if (st.ok()) {
        bool last = t.next == op.total;
        streams_[0]->push_control(std::move(*out));
        *out = stream::TxItem{};
        if (last) tx_.pop_front();
        // A list took microseconds to make: stream 0 writes it before the next is made, so that
        // the peer works on it meanwhile (its turn pulls again).
        return false;
      }
      if (st.code() != Code::kUnavailable) {
        stop(t.op, chunk_failure(st));
        continue;
      }
      len = std::min<uint64_t>(path->path->max_chunk(), room);  // the path says why, chunk by chunk
    }
    if (path != nullptr) {
      if (Status st = post_path_chunk(*path, t, len, out); !st.ok()) {
        // The path cannot carry this source (cuda_ipc: memory CUDA IPC cannot export): the
        // transfer moves by the next path (shm, or inline on stream 0), said once per path.
        if (st.code() == Code::kUnavailable) {
          note_fallback(*path, st);
          t.skip_paths |= path_bit(path->id);
          continue;
        }
        stop(t.op, chunk_failure(st));  // removes the transfer
        continue;
      }
      // Path headers go in stream 0's control queue, in the order their sequence numbers were
      // taken, with the message frames (RTS, EAGER) posted meanwhile: neither may overtake the other.
      bool last = t.next == op.total;
      streams_[0]->push_control(std::move(*out));
      *out = stream::TxItem{};
      if (last) tx_.pop_front();
      continue;
    }
    out->src = src;
    out->where = t.where;
    out->len = len;
    out->ctx = t.op;
    if (session_.multilink) link_pulled(stream, out, &t);  // kept until the peer has it
    t.next += len;
    t.emitted = true;
    op.handed += len;
    ++op.inflight;
    if (striping_) striping_->took(stream);
    if (t.next == op.total) tx_.pop_front();
    return true;
  }
  return false;
}

uint64_t EndpointImpl::inline_chunk(const Transfer& t) const {
  return striping_ ? striping_->chunk(t.op->total, t.where) : session_.chunk_size;
}

// Caller holds mu_.
void EndpointImpl::wake_for(const Transfer& t) {
  if (striping_) striping_->wake_for(t.op->total, t.op->total - t.next, t.where);
  else streams_[0]->wake();
}

void EndpointImpl::note_fallback(const PathState& ps, const Status& why) {
  if ((fallback_noted_ & path_bit(ps.id)) != 0) return;
  fallback_noted_ |= path_bit(ps.id);
  DMX_LOG_WARN("endpoint to {}: the {} path cannot carry a source, which goes by the next path (said once): {}",
               session_.peer, ps.path->name(), why.to_string());
}

void EndpointImpl::on_sent(int stream, stream::TxItem& item) {
  if (item.pulled && session_.multilink) {  // done when the peer acknowledges it (endpoint/links.cc)
    std::lock_guard<std::mutex> lock(mu_);
    link_sent(stream, item);
    return;
  }
  auto op = std::static_pointer_cast<OpState>(item.ctx);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (item.pulled && striping_) striping_->wrote(stream);
    if (session_.checksum && wire::carries_data(item.header.type) && !vec_write(*op))
      fold_chunk(*op, chunk_offset(*op, item.header), item.len, item.header.crc);
    if (op->eager) {
      op->done = op->total;
      finish(*op, Status());
    } else {
      chunk_sent(op, item.len - wire::inline_table_bytes(item.header), Status());
    }
  }
  deliver();
}

void EndpointImpl::chunk_sent(const std::shared_ptr<OpState>& op, uint64_t len, const Status& s) {
  --op->inflight;
  if (op->phase == OpPhase::kFinished || op->phase == OpPhase::kDelivered) return;
  if (op->acked && op->phase == OpPhase::kActive) {  // the target has it all: done once the source is free
    if (op->inflight == 0) finish(*op, Status());
    return;
  }
  if (s.ok()) op->done += len;
  else if (op->eager) finish(*op, s);  // an eager send by a path: one chunk, not stoppable
  else stop(op, s);
  if (op->phase == OpPhase::kStopping) {
    settle_stopped(op);
  } else if (op->done == op->total && op->type == OpType::kSend) {
    sends_.erase(op->id);
    finish(*op, Status());
  } else if (op->done == op->total && op->type == OpType::kReadResponse) {
    finish(*op, Status());
  }
}

}  // namespace dmx
