// Endpoint: what the streams send. With a payload path agreed there is one stream, which pulls
// the next chunk of the oldest transfer, by the path when it carries the source (a path that
// cannot carry this particular source is passed over for that transfer; the chunk's header then
// goes in stream 0's control queue), else inline. Without one, the data streams (1..N; stream 0
// alone when N is 1) pull the chunks inline, balanced by their load. The streams report each frame
// written (on_sent), which completes eager sends and counts chunks.
#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "core/log.h"
#include "engine/endpoint/endpoint_impl.h"
#include "engine/endpoint/internal.h"

namespace dmx {

using wire::FrameHeader;
using wire::FrameType;
using namespace endpoint;

// Transmit side: streams pull chunks of the oldest transfer first.
bool EndpointImpl::next_chunk(int stream, stream::TxItem* out) {
  if (!has_tx_.load(std::memory_order_acquire)) return false;  // idle streams poll without the lock
  // Stream 0 pulls only when it is the only stream, as it always is with a payload path (whose
  // chunk headers keep their order on it). Beside data streams it is the control stream: an RTS
  // or CTS must not wait behind megabytes of data in its socket while the data streams run dry.
  if (streams_.size() > 1 && (stream == 0 || leave_to_least_loaded(stream))) return false;
  std::lock_guard<std::mutex> lock(mu_);
  struct Sync {  // keeps has_tx_ equal to !tx_.empty() on every return
    EndpointImpl* ep;
    ~Sync() { ep->has_tx_.store(!ep->tx_.empty(), std::memory_order_release); }
  } sync{this};
  while (!tx_.empty()) {
    Transfer& t = tx_.front();
    OpState& op = *t.op;
    // An empty transfer (one empty chunk) always goes inline: no path has anything to move.
    PathState* path = has_paths_ && op.total > 0 ? path_for(t.where, t.accepts, t.skip_paths) : nullptr;
    // A window per path keeps cancel effective and memory bounded; completions wake stream 0.
    if (path != nullptr && path->tx.size() >= kPathWindow) return false;
    uint64_t len = std::min<uint64_t>(path ? path->path->max_chunk() : inline_chunk(t), op.total - t.next);
    if (len == 0 && t.emitted) {
      tx_.pop_front();
      continue;
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
        break;
      default:  // kReadData
        h.a0 = t.next;
        h.a1 = op.total;
        break;
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
        stop(t.op, st);  // removes the transfer
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
    out->src = t.src + t.next;
    out->where = t.where;
    out->len = len;
    out->ctx = t.op;
    t.next += len;
    t.emitted = true;
    op.handed += len;
    ++op.inflight;
    stream_load_[stream].fetch_add(1, std::memory_order_relaxed);
    if (t.next == op.total) tx_.pop_front();
    return true;
  }
  return false;
}

// A message too small to give every data stream a chunk of chunk_size is cut into
// host_chunk_size pieces when it is host memory, so that it still spreads over the streams: a
// 1 MiB message on 8 streams otherwise rides one of them. Device memory keeps chunk_size, the unit
// its staging copies are fastest at (docs/performance.md); so does a single stream, which has
// nothing to spread over.
uint64_t EndpointImpl::inline_chunk(const Transfer& t) const {
  if (streams_.size() == 1 || t.where.is_device()) return session_.chunk_size;
  uint64_t data_streams = streams_.size() - 1;  // beside the control stream
  if (t.op->total >= data_streams * session_.chunk_size) return session_.chunk_size;
  return std::min(params_.host_chunk_size, session_.chunk_size);
}

// A data stream more than kStreamSlack chunks ahead of the least loaded one leaves the next chunk
// to it (and wakes it: it may be parked). Read without the lock, which a busy-polling stream
// would otherwise take on every pass: the loads are a hint, each changed by one stream's chunks.
bool EndpointImpl::leave_to_least_loaded(int stream) {
  auto load = [&](size_t i) { return stream_load_[i].load(std::memory_order_relaxed); };
  size_t least = 1;
  for (size_t i = 2; i < streams_.size(); ++i)
    if (load(i) < load(least)) least = i;
  if (load(stream) <= load(least) + kStreamSlack) return false;
  streams_[least]->wake();
  return true;
}

// Wakes as many data streams as the new transfer has chunks, least loaded first: waking them all
// for a one-chunk message had every parked stream race for it. Caller holds mu_.
void EndpointImpl::wake_for(const Transfer& t) {
  if (streams_.size() == 1) {
    streams_[0]->wake();
    return;
  }
  std::array<std::pair<uint32_t, uint8_t>, wire::stream_sockets(wire::kMaxStreams)> by_load;
  size_t n = 0;
  for (size_t i = 1; i < streams_.size(); ++i)
    by_load[n++] = {stream_load_[i].load(std::memory_order_relaxed), static_cast<uint8_t>(i)};
  uint64_t chunk = inline_chunk(t);
  uint64_t chunks = std::max<uint64_t>(1, (t.op->total - t.next + chunk - 1) / chunk);
  size_t wake = static_cast<size_t>(std::min<uint64_t>(chunks, n));
  std::partial_sort(by_load.begin(), by_load.begin() + wake, by_load.begin() + n);
  for (size_t i = 0; i < wake; ++i) streams_[by_load[i].second]->wake();
}

void EndpointImpl::note_fallback(const PathState& ps, const Status& why) {
  if ((fallback_noted_ & path_bit(ps.id)) != 0) return;
  fallback_noted_ |= path_bit(ps.id);
  DMX_LOG_WARN("endpoint to {}: the {} path cannot carry a source, which goes by the next path (said once): {}",
               session_.peer, ps.path->name(), why.to_string());
}

void EndpointImpl::on_sent(int stream, stream::TxItem& item) {
  auto op = std::static_pointer_cast<OpState>(item.ctx);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (item.pulled && stream_load_[stream].load(std::memory_order_relaxed) > 0)
      stream_load_[stream].fetch_sub(1, std::memory_order_relaxed);
    if (session_.checksum && wire::carries_data(item.header.type))
      fold_chunk(*op, chunk_offset(*op, item.header), item.len, item.header.crc);
    if (op->eager) {
      op->done = op->total;
      finish(*op, Status());
    } else {
      chunk_sent(op, item.len, Status());
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
