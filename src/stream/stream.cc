#include "stream/stream.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/crc32c.h"
#include "core/log.h"
#include "core/trace.h"

namespace dmx::stream {
namespace {

// Bytes of ours the peer's host must acknowledge between two looks for a silent peer to count as
// alive (Stream::turn): far more than the probes and keepalives sent meanwhile.
constexpr uint64_t kAckedAlive = 64 << 10;

}  // namespace

uint64_t Stream::ns_since(Clock::time_point t) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count());
}

Result<RxPlan> StreamHost::on_prefix(int, const wire::FrameHeader& h, const std::vector<unsigned char>&) {
  return Status(Code::kInternal, fmt::format("no plan for the rest of {}", wire::describe(h)));
}

Stream::Stream(StreamConfig config, std::unique_ptr<Conduit> conduit, StreamHost* host, StagingPool* pool)
    : config_(std::move(config)), conduit_(std::move(conduit)), host_(host), pool_(pool) {
  scratch_.resize(64 << 10);
  last_tx_ = last_rx_ = last_progress_ = prev_ = last_probe_ = Clock::now();
}

// By contract the stream has ended and its worker let go of it (finish() ran).
Stream::~Stream() = default;

void Stream::push_control(TxItem item) {
  if (item.reply) reply_bytes_.fetch_add(wire::kHeaderSize + item.len, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    control_.push_back(std::move(item));
    has_control_.store(true, std::memory_order_release);
  }
  wake();
}

void Stream::wake() {
  // A busy-polling stream finds the work itself: no lock or system call on the poster's path.
  if (!sleeping_.load(std::memory_order_seq_cst)) return;
  if (Worker* w = slot_.worker.load(std::memory_order_acquire)) ready(w, this);
}

void Stream::stop() {
  stop_.store(true, std::memory_order_release);
  conduit_->shutdown();  // the peer's streams see the end now, not at the next keepalive
  if (Worker* w = slot_.worker.load(std::memory_order_acquire)) ready(w, this);  // whether or not it sleeps
}

StreamStats Stream::stats() const {
  StreamStats s;
  s.bytes_sent = stats_.bytes_sent.load(std::memory_order_relaxed);
  s.bytes_received = stats_.bytes_received.load(std::memory_order_relaxed);
  s.frames_sent = stats_.frames_sent.load(std::memory_order_relaxed);
  s.frames_received = stats_.frames_received.load(std::memory_order_relaxed);
  s.d2h_copies = stats_.d2h_copies.load(std::memory_order_relaxed);
  s.d2h_bytes = stats_.d2h_bytes.load(std::memory_order_relaxed);
  s.h2d_copies = stats_.h2d_copies.load(std::memory_order_relaxed);
  s.h2d_bytes = stats_.h2d_bytes.load(std::memory_order_relaxed);
  s.pushes = stats_.pushes.load(std::memory_order_relaxed);
  s.lists = stats_.lists.load(std::memory_order_relaxed);
  s.ns_send = stats_.ns_send.load(std::memory_order_relaxed);
  s.ns_recv = stats_.ns_recv.load(std::memory_order_relaxed);
  s.ns_copy_wait = stats_.ns_copy_wait.load(std::memory_order_relaxed);
  return s;
}

Result<CopyQueue*> Stream::queue_for(MemSpec where) { return queues_.get(where); }

Status Stream::ensure_slots() {
  if (!slots_.empty()) return Status();
  // Slots come from the first device backend this stream meets; pinned memory serves every
  // device, and plain host memory serves the simulated one.
  MemoryBackend* backend = nullptr;
  for (MemKind k : {MemKind::kCuda, MemKind::kSim}) {
    for (MemSpec d : queues_.devices()) {
      if (d.kind == k)
        if (auto b = backend_for(d); b.ok()) backend = *b;
    }
    if (backend) break;
  }
  if (backend == nullptr) return Status(Code::kInternal, "staging requested with no device queue");
  size_t per_dir = static_cast<size_t>(config_.slots);
  // Per direction `slots`, plus one for control frames with a device payload (eager sends).
  DMX_ASSIGN_OR_RETURN(slots_, pool_->take(backend, 2 * per_dir + 1));
  for (int i = 0; i < static_cast<int>(per_dir); ++i) {
    free_tx_slots_.push_back(i);
    free_rx_slots_.push_back(static_cast<int>(per_dir) + i);
  }
  return Status();
}

// Pulls chunks while the pipeline has room; starts the device->host copy of staged ones.
Status Stream::fill_pipeline(bool* progress) {
  // Every chunk in the pipeline, and those being written, may hold a slot.
  while (chunks_.size() + out_chunks_ < static_cast<size_t>(config_.slots)) {
    TxItem item;
    if (!host_->next_chunk(config_.index, &item)) break;
    *progress = true;
    item.pulled = true;
    if (item.where.is_device() && item.len > 0) {
      DMX_ASSIGN_OR_RETURN(item.queue, queue_for(item.where));
      DMX_RETURN_IF_ERROR(ensure_slots());
      assert(!free_tx_slots_.empty() && "pipeline depth equals the number of tx slots");
      item.slot = free_tx_slots_.back();
      free_tx_slots_.pop_back();
      if (checks(item.header)) {
        DMX_ASSIGN_OR_RETURN(item.crc_ticket, item.queue->checksum(item.src, item.len));
      }
      [[maybe_unused]] auto t0 = Clock::now();
      if (item.pieces.empty()) {
        DMX_RETURN_IF_ERROR(
            staging_copy(item.queue, slots_.at(item.slot), item.src, item.len, config_.push_tx_max, true));
      } else {  // an inline table: the table, then each piece behind it, gathered into the slot
        if (item.len > pool_->slot_size()) return Status(Code::kInternal, "an inline table larger than a staging slot");
        auto* at = static_cast<char*>(slots_.at(item.slot));
        std::memcpy(at, item.owned.data(), item.owned.size());
        at += item.owned.size();
        spans_.clear();
        for (const Piece& p : item.pieces) {
          spans_.push_back(CopyQueue::Span{at, p.at, p.len});
          at += p.len;
        }
        DMX_RETURN_IF_ERROR(staging_copy_list(item.queue, true));
      }
      DMX_ASSIGN_OR_RETURN(item.fence, item.queue->record());
      DMX_TRACE_SPAN("d2h", this, t0);  // the chunk's device->host copy issued
      stats_.d2h_copies.fetch_add(item.pieces.empty() ? 1 : item.pieces.size(), std::memory_order_relaxed);
      stats_.d2h_bytes.fetch_add(item.len, std::memory_order_relaxed);
    }
    chunks_.push_back(std::move(item));
  }
  return Status();
}

// Appends the next frame to the batch being written: control frames first, then the oldest chunk
// once staged. False when none is ready, or when staging a control frame's device payload failed
// (control_error_).
bool Stream::take_next() {
  TxItem item;
  bool got = false, chunk = false;
  // The lock only when something was pushed: a busy-polling worker would otherwise hold it so
  // often that pushers (under the endpoint's lock) block on it.
  if (has_control_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!control_.empty()) {
      const TxItem& f = control_.front();
      // A small device payload travelling inline (eager) is staged through the one reserved
      // pinned slot, waiting for the copy (microseconds): it starts a batch of its own, so the
      // frames before it are not held up and no two such frames share the slot.
      if (f.where.is_device() && f.len > 0 && f.slot < 0 && !out_.empty()) return false;
      item = std::move(control_.front());
      control_.pop_front();
      got = true;
    }
    has_control_.store(!control_.empty(), std::memory_order_relaxed);
  }
  if (got && item.where.is_device() && item.len > 0 && item.slot < 0) {
    if (Status s = stage_control(item); !s.ok()) {
      control_error_ = s;
      return false;
    }
  }
  if (!got && !chunks_.empty()) {
    TxItem& front = chunks_.front();
    if (front.fence != 0) {
      auto done = front.queue->done(front.fence);
      if (!done.ok() || !*done) return false;  // errors surface on the next fill or wait
      DMX_TRACE_AT("d2h.ok", this);  // seen done, in issue order
#if defined(DMX_TRACE_ENABLED)
      if (trace_stall_ != Clock::time_point{}) {
        DMX_TRACE_SPAN("d2h.stall", this, trace_stall_);  // the socket waited for this copy
        trace_stall_ = Clock::time_point{};
      }
#endif
    }
    item = std::move(front);
    chunks_.pop_front();
    got = chunk = true;
  }
  if (!got) return false;
  item.header.payload_len = static_cast<uint32_t>(item.len);
  stamp(item);
  wire::HeaderBytes header = wire::encode_header(item.header);
  out_.push_back(OutFrame{std::move(item), header, chunk});
  if (chunk) ++out_chunks_;
  return true;
}

Status Stream::stage_control(TxItem& item) {
  DMX_ASSIGN_OR_RETURN(item.queue, queue_for(item.where));
  DMX_RETURN_IF_ERROR(ensure_slots());
  if (item.len > pool_->slot_size()) return Status(Code::kInternal, "inline payload larger than a staging slot");
  int slot = 2 * config_.slots;  // the reserved control slot
  DMX_TRACE_POINT("st.d2h");
  if (checks(item.header)) {
    DMX_ASSIGN_OR_RETURN(item.crc_ticket, item.queue->checksum(item.src, item.len));
  }
  DMX_RETURN_IF_ERROR(staging_copy(item.queue, slots_.at(slot), item.src, item.len, config_.push_tx_max, true));
  DMX_ASSIGN_OR_RETURN(uint64_t fence, item.queue->record());
  DMX_TRACE_POINT("st.d2h.issued");
  DMX_RETURN_IF_ERROR(item.queue->wait(fence, Deadline::after(std::chrono::seconds(30))));
  DMX_TRACE_POINT("st.d2h.done");
  stats_.d2h_copies.fetch_add(1, std::memory_order_relaxed);
  stats_.d2h_bytes.fetch_add(item.len, std::memory_order_relaxed);
  item.slot = slot;
  item.fence = 0;
  return Status();
}

Status Stream::staging_copy(CopyQueue* q, void* dst, const void* src, size_t n, uint64_t push_max, bool to_host) {
  if (n > 0 && n <= push_max) {
    Status s = q->push(dst, src, n);
    if (s.ok()) {
      DMX_TRACE_POINT("st.pushed");  // the SM copy kernel launched
      stats_.pushes.fetch_add(1, std::memory_order_relaxed);
      return s;
    }
    if (s.code() != Code::kUnavailable) return s;
    if (!push_refusal_logged_) {
      push_refusal_logged_ = true;
      DMX_LOG_INFO("stream {} to {}: a small staging copy goes by the copy engine, not pushed: {}", config_.index,
                   config_.peer, s.message());
    }
  }
  Status s = to_host ? q->to_host(dst, src, n) : q->to_device(dst, src, n);
  DMX_TRACE_POINT("st.copied");  // the copy-engine copy issued
  return s;
}

Status Stream::staging_copy_list(CopyQueue* q, bool to_host) {
  if (spans_.size() > 1) {  // one span: a list would add a kernel to its copy
    Status s = q->copy_list(spans_.data(), spans_.size(), to_host);
    if (s.ok()) {
      stats_.lists.fetch_add(1, std::memory_order_relaxed);
      return s;
    }
    if (s.code() != Code::kUnavailable) return s;
    if (!list_refusal_logged_) {
      list_refusal_logged_ = true;
      DMX_LOG_INFO("stream {} to {}: an inline table's device pieces go a copy each, not as one list: {}",
                   config_.index, config_.peer, s.message());
    }
  }
  const uint64_t push_max = to_host ? config_.push_tx_max : config_.push_rx_max;
  for (const CopyQueue::Span& sp : spans_)
    DMX_RETURN_IF_ERROR(staging_copy(q, sp.dst, sp.src, sp.n, push_max, to_host));
  return Status();
}

// The bytes' CRC: the device's, computed with the staging copy (its fence covers both), or the
// CPU's over host memory, just before the bytes go out.
void Stream::stamp(TxItem& item) const {
  if (!checks(item.header)) return;
  item.header.flags |= wire::kFlagChecksum;
  if (item.crc_ticket != 0) item.header.crc = item.queue->checksum_result(item.crc_ticket);
  else item.header.crc = crc32c::of(item.src, item.len);
}

Status Stream::step_tx(Io* io) {
  *io = Io::kIdle;
  for (int rounds = 0; rounds < 64; ++rounds) {
    while (out_.size() < kMaxBatch && take_next()) {
    }
    if (!control_error_.ok()) return std::exchange(control_error_, Status());
    if (out_.empty()) {
#if defined(DMX_TRACE_ENABLED)
      if (!chunks_.empty() && trace_stall_ == Clock::time_point{}) trace_stall_ = Clock::now();
#endif
      return Status();
    }
    iov_.clear();
    size_t skip = out_written_;  // only the front frame is partly written
    size_t pieces = 0, piece_bytes = 0;
    bool full = false;
    auto add = [&](const void* p, size_t len) {  // whether it went in this write
      if (skip >= len) {
        skip -= len;
        return false;
      }
      // Past the limit the rest waits for the next write (the bytes written are counted per frame).
      full |= iov_.size() == kMaxIov;
      if (!full) iov_.push_back({static_cast<char*>(const_cast<void*>(p)) + skip, len - skip});
      skip = 0;
      return !full;
    };
    for (OutFrame& f : out_) {
      add(f.header.data(), wire::kHeaderSize);
      if (f.item.slot >= 0 || f.item.pieces.empty()) {
        add(f.item.slot >= 0 ? slots_.at(f.item.slot) : f.item.src, f.item.len);
      } else {  // an inline table of host memory: the table, then the pieces where they are
        add(f.item.owned.data(), f.item.owned.size());
        for (const Piece& p : f.item.pieces) {
          // A write the socket takes only part of costs the kernel every iovec it was given:
          // a table's pieces go a bounded batch at a time (kScatterIov, kScatterBytes).
          if (add(p.at, p.len)) full |= ++pieces >= kScatterIov || (piece_bytes += p.len) >= kScatterBytes;
        }
      }
    }
    if (config_.index == 0) DMX_TRACE_POINT("s0.write");
    auto t0 = Clock::now();
    Result<size_t> k = conduit_->write(std::span<const iovec>(iov_.data(), iov_.size()));
    stats_.ns_send.fetch_add(ns_since(t0), std::memory_order_relaxed);
    if (!k.ok()) return k.status();
    if (*k > 0) DMX_TRACE_SPAN("wr", this, t0);  // not the refused ones: a busy poll would fill the file
    if (*k == 0) {
      *io = Io::kBlocked;
      return Status();
    }
    *io = Io::kProgress;
    burst_bytes_ += *k;
    last_tx_ = Clock::now();
    for (size_t left = *k; left > 0;) {
      size_t rest = wire::kHeaderSize + out_.front().item.len - out_written_;
      if (left < rest) {
        out_written_ += left;
        break;
      }
      left -= rest;
      out_written_ = 0;
      TxItem done = std::move(out_.front().item);
      if (out_.front().chunk) --out_chunks_;
      out_.pop_front();
      frame_sent(done);  // may push control frames (completions): out_ is consistent by now
    }
  }
  return Status();
}

// The whole frame is out.
void Stream::frame_sent(TxItem& item) {
  stats_.frames_sent.fetch_add(1, std::memory_order_relaxed);
  stats_.bytes_sent.fetch_add(item.len, std::memory_order_relaxed);
  if (wire::is_chunk(item.header.type)) burst_data_ += item.len;
  if (item.slot >= 0 && item.slot < 2 * config_.slots) free_tx_slots_.push_back(item.slot);
  if (config_.index == 0)
    DMX_TRACE_POINT(item.header.type == wire::FrameType::kEager      ? "s0.out.eager"
                    : item.header.type == wire::FrameType::kPathDone ? "s0.out.pathdone"
                                                                     : "s0.out.other");
  if (item.reply) reply_bytes_.fetch_sub(wire::kHeaderSize + item.len, std::memory_order_relaxed);
  if (item.ctx) host_->on_sent(config_.index, item);
}

// Idle timers (keepalive, silence) fire on a grid of keepalive/8, at most 100 ms and at least 1 ms,
// counted from the clock's epoch: the thousand idle streams of a worker then wake it a few times
// per keepalive interval together instead of a thousand times apart, and their peers' keepalives
// arrive together too. A time already past (a keepalive held back by a full socket) moves to the
// next grid point: the wait for room, not the timer, ends that sleep.
Clock::time_point Stream::coalesce(Clock::time_point t, Clock::time_point now) const {
  auto grain = std::clamp<std::chrono::microseconds>(config_.keepalive / 8, std::chrono::milliseconds(1),
                                                      std::chrono::milliseconds(100));
  if (t <= now) t = now + std::chrono::microseconds(1);
  auto since = t.time_since_epoch();
  auto g = std::chrono::duration_cast<Clock::duration>(grain);
  auto rounded = (since + g - Clock::duration(1)) / g * g;
  return Clock::time_point(rounded);
}

// One pass: what the worker thread's loop did once per round before streams shared workers.
Stream::Turn Stream::turn() {
  if (stop_.load(std::memory_order_acquire)) return Turn::kDone;
  bool progress = false;
  Io tx = Io::kIdle, rx = Io::kIdle;
  const uint64_t burst_before = burst_bytes_;
  // A keepalive goes out in this pass's transmit, not in a pass of its own.
  const bool busy = config_.busy_peer_timeout.count() > 0 && host_->awaiting();
  auto start = Clock::now();
  if (start - last_tx_ >= config_.keepalive && out_.empty() && chunks_.empty() &&
      !has_control_.load(std::memory_order_acquire))
    push_keepalive(false);
  // Operations wait on a peer we have not heard from for a while: every eighth of the limit, see
  // whether the peer's host took more of our data (a slow link, a large frame: alive), and
  // otherwise, once silent for a quarter, ask the peer to answer now.
  const auto step = config_.busy_peer_timeout / 8;
  if (busy && start - last_rx_ >= step && start - last_probe_ >= step) {
    // Growth since the previous look, when that look was recent (the first look of a silence only
    // takes the count: what was acknowledged before may predate it), and more than our own probes
    // and keepalives: a frozen peer's kernel still acknowledges those (and data until its receive
    // buffer is full).
    bool recent = start - last_probe_ <= 2 * step;
    last_probe_ = start;
    uint64_t acked = conduit_->acked_bytes();
    bool grew = acked > acked_seen_ + kAckedAlive;
    acked_seen_ = acked;
    if (recent && grew) {
      last_rx_ = start;
    } else if (start - last_rx_ >= 2 * step) {
      push_keepalive(true);
    }
  }
  failure_ = reap_rx(false, &progress);
  if (failure_.ok()) failure_ = fill_pipeline(&progress);
  if (failure_.ok()) failure_ = step_tx(&tx);
  paused_ = host_->rx_paused();
  if (failure_.ok() && !stop_.load(std::memory_order_acquire) && !paused_) failure_ = step_rx(&rx);
  if (!failure_.ok()) return Turn::kDone;
  auto now = Clock::now();
  Clock::time_point due = host_->ticks(config_.index) ? host_->on_tick() : Clock::time_point::max();
  if (paused_) {
    // Not reading is our choice, not the peer's silence; but a peer that takes none of the
    // replies it asked for within peer_timeout is gone or hostile.
    last_rx_ = now;
    rx_frame_start_ += now - prev_;  // nor does the frame in progress use its budget meanwhile
    if (config_.index == 0 && now - last_tx_ > config_.peer_timeout) {
      failure_ = Status(Code::kResourceExhausted,
                        fmt::format("the peer read none of its {} bytes of replies for {} ms; closing it",
                                    reply_backlog(),
                                    std::chrono::duration_cast<std::chrono::milliseconds>(now - last_tx_).count()));
      return Turn::kDone;
    }
  }
  auto limit = silence_limit(busy);
  if (now - last_rx_ > limit) {
    failure_ = Status(Code::kPeerFailed,
                      fmt::format("peer sent nothing for {} ms (stream {}{})",
                                  std::chrono::duration_cast<std::chrono::milliseconds>(now - last_rx_).count(),
                                  config_.index,
                                  busy ? fmt::format(", operations pending: busy_peer_timeout {} ms",
                                                     std::chrono::duration_cast<std::chrono::milliseconds>(limit).count())
                                       : ""));
    return Turn::kDone;
  }
  failure_ = check_frame_budget(now);
  if (!failure_.ok()) return Turn::kDone;
  prev_ = now;
  if (progress || tx == Io::kProgress || rx == Io::kProgress) {
    last_progress_ = now;
    if (armed_) sleeping_.store(false, std::memory_order_seq_cst);
    armed_ = false;
    return Turn::kAgain;
  }
  // Bulk data does not spin: the next chunk's wake-up costs little beside the chunk's own copy,
  // and spinning after it cost CPU for no speed (docs/performance.md). Device copies
  // in flight do: they complete without an event to wake us. A burst ends at a pass that moved no
  // byte; one that wrote and then found the socket full has not ended it.
  if (burst_bytes_ == burst_before && burst_bytes_ > 0) {
    spin_ = burst_data_ < kBulkBurst;
    burst_bytes_ = burst_data_ = 0;
  }
  bool copies = !pending_rx_.empty() || (!chunks_.empty() && chunks_.front().fence != 0);
  if ((spin_ || copies) && now - last_progress_ < config_.busy_poll) return Turn::kAgain;
  // Before parking, say so and make one more pass: whatever was queued before the flag was set is
  // found by that pass, and whoever queues after it sees the flag and wakes us (wake()).
  if (!armed_) {
    sleeping_.store(true, std::memory_order_seq_cst);
    armed_ = true;
    return Turn::kAgain;
  }
  // Nothing moved for a while: park until the conduit or a wake-up, or briefly while copies are in
  // flight; at the latest until the next keepalive or silence check (on the coalescing grid, so
  // that idle streams share their worker's wake-ups) or deadline (no sooner than `tick`, so that
  // deadlines close together share one wake-up).
  auto idle_due = std::min(last_tx_ + config_.keepalive, last_rx_ + limit);
  if (busy) idle_due = std::min(idle_due, std::max(last_rx_, last_probe_) + config_.busy_peer_timeout / 8);
  idle_due = coalesce(idle_due, now);
  auto timeout = std::chrono::ceil<std::chrono::microseconds>(idle_due - now);
  if (due != Clock::time_point::max())
    timeout = std::min(timeout, std::max(config_.tick, std::chrono::ceil<std::chrono::microseconds>(due - now)));
  if (copies) timeout = std::chrono::microseconds(20);
  if (paused_) timeout = std::min<std::chrono::microseconds>(timeout, std::chrono::milliseconds(1));
  want_room_ = tx == Io::kBlocked;
  wake_by_ = now + timeout;
  return Turn::kSleep;
}

std::chrono::microseconds Stream::silence_limit(bool busy) const {
  return busy ? std::min(config_.busy_peer_timeout, config_.peer_timeout) : config_.peer_timeout;
}

void Stream::push_keepalive(bool probe) {
  TxItem ka;
  ka.header.type = wire::FrameType::kKeepalive;
  ka.header.a0 = probe ? 1 : 0;  // 1: answer at once
  std::lock_guard<std::mutex> lock(mu_);
  control_.push_back(std::move(ka));
  has_control_.store(true, std::memory_order_release);
}

int Stream::sleep_fds(pollfd* fds) {
  // Paused: input must not wake us (we would not read it); room to write and wake-ups do.
  return paused_ ? 0 : conduit_->prepare_sleep(want_room_, fds);
}

void Stream::woke() {
  conduit_->after_sleep();
  sleeping_.store(false, std::memory_order_seq_cst);
  armed_ = false;
}

void Stream::finish() {
  if (!failure_.ok() && !stop_.load(std::memory_order_acquire))
    host_->on_stream_failed(config_.index, failure_.with_peer(config_.peer)
                                               .with_origin(fmt::format("{}/stream {}", conduit_->kind(), config_.index)));
  drain();
  host_->on_stream_stopped(config_.index);
}

// Waits for copies still in flight (they may write user memory), then drops all references.
void Stream::drain() {
  if (Status s = queues_.drain(Deadline::after(std::chrono::seconds(30))); !s.ok())
    DMX_LOG_ERROR("stream {}: copies did not finish while closing: {}", config_.index, s.to_string());
  pending_rx_.clear();
  chunks_.clear();
  out_.clear();
  out_written_ = out_chunks_ = 0;
  rx_plan_ = RxPlan();
  std::lock_guard<std::mutex> lock(mu_);
  control_.clear();
  has_control_.store(false, std::memory_order_relaxed);
  reply_bytes_.store(0, std::memory_order_relaxed);
}

}  // namespace dmx::stream
