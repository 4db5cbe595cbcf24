// The receiving side of a Stream (stream.h): headers through a read-ahead, payloads straight
// into their destinations (host memory in place, a bulk host chunk through a small buffer and
// non-temporal stores, device memory through a staging slot and its copy queue), and the frame
// budget that closes a peer trickling a frame.
#include "stream/stream.h"

#include <fmt/format.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/crc32c.h"
#include "core/log.h"
#include "core/stream_copy.h"
#include "core/trace.h"

namespace dmx::stream {

Status Stream::begin_payload() {
  wire::FrameHeader& h = rx_;
  DMX_ASSIGN_OR_RETURN(rx_plan_, host_->on_header(config_.index, h));
  rx_payload_got_ = 0;
  if (config_.index == 0) DMX_TRACE_POINT("s0.planned");
  if (h.payload_len == 0) return finish_payload();
  switch (rx_plan_.kind) {
    case RxPlan::Kind::kNone:
      return Status(Code::kInternal, fmt::format("no destination for the payload of {}", wire::describe(h)));
    case RxPlan::Kind::kControl:
      if (rx_plan_.prefix >= h.payload_len)
        return Status(Code::kInternal, fmt::format("a {}-byte prefix of {}", rx_plan_.prefix, wire::describe(h)));
      rx_plan_.control.resize(rx_plan_.prefix != 0 ? rx_plan_.prefix : h.payload_len);
      break;
    case RxPlan::Kind::kDevice:
      DMX_RETURN_IF_ERROR(take_rx_slot(h.payload_len));
      break;
    case RxPlan::Kind::kHost:
    case RxPlan::Kind::kDiscard:
      break;
  }
  rx_plan_at_ = rx_piece_ = rx_piece_got_ = 0;
  in_payload_ = true;
  return Status();
}

// The prefix has landed: the host plans the rest of the payload.
Status Stream::begin_rest() {
  DMX_ASSIGN_OR_RETURN(RxPlan rest, host_->on_prefix(config_.index, rx_, rx_plan_.control));
  const size_t left = rx_.payload_len - rx_payload_got_;
  uint64_t sum = 0;
  bool empty_piece = false;
  for (const Piece& p : rest.pieces) {
    sum += p.len;
    empty_piece |= p.len == 0;
  }
  bool kind = rest.kind == RxPlan::Kind::kHost || rest.kind == RxPlan::Kind::kDevice ||
              rest.kind == RxPlan::Kind::kDiscard;
  if (!kind || rest.prefix != 0 || empty_piece || (!rest.pieces.empty() && sum != left) ||
      (rest.kind != RxPlan::Kind::kDiscard && rest.pieces.empty()))
    return Status(Code::kInternal, fmt::format("the host's plan for the rest of {} does not fit it", wire::describe(rx_)));
  rx_plan_ = std::move(rest);
  rx_plan_at_ = rx_payload_got_;
  rx_piece_ = rx_piece_got_ = 0;
  if (rx_plan_.kind == RxPlan::Kind::kDevice) return take_rx_slot(left);
  return Status();
}

// A receive slot for `len` bytes bound for rx_plan_.where, once a copy in flight frees one.
Status Stream::take_rx_slot(size_t len) {
  DMX_ASSIGN_OR_RETURN(CopyQueue * q, queue_for(rx_plan_.where));
  (void)q;
  DMX_RETURN_IF_ERROR(ensure_slots());
  if (len > pool_->slot_size())
    return Status(Code::kProtocol, fmt::format("{} is larger than a staging slot", wire::describe(rx_)));
  if (free_rx_slots_.empty()) {
    bool progress = false;
    auto t0 = Clock::now();
    DMX_RETURN_IF_ERROR(reap_rx(/*block=*/true, &progress));
    stats_.ns_copy_wait.fetch_add(ns_since(t0), std::memory_order_relaxed);
    DMX_TRACE_SPAN("slot", this, t0);  // no free receive slot: waited for a host->device copy
  }
  rx_slot_ = free_rx_slots_.back();
  free_rx_slots_.pop_back();
  return Status();
}

// An inline table's bytes, in a slot, go to their pieces: host ones copied now, device ones by
// their device's queue, under one fence on `q` (the plan's). A table that spans two devices
// (rare) waits here for the other devices' copies.
Status Stream::scatter_from_slot(CopyQueue* q, uint64_t* fence) {
  const auto* slot = static_cast<const char*>(slots_.at(rx_slot_));
  std::vector<MemSpec> devices{rx_plan_.where};  // the plan's first: its fence covers its pieces
  size_t at = 0;
  for (const Piece& p : rx_plan_.pieces) {  // host pieces now
    if (!p.where.is_device()) std::memcpy(p.at, slot + at, p.len);
    else if (std::find(devices.begin(), devices.end(), p.where) == devices.end()) devices.push_back(p.where);
    at += p.len;
  }
  for (size_t d = 0; d < devices.size(); ++d) {  // each device's pieces as one list
    CopyQueue* each = q;
    if (d > 0) {
      DMX_ASSIGN_OR_RETURN(each, queue_for(devices[d]));
    }
    spans_.clear();
    at = 0;
    for (const Piece& p : rx_plan_.pieces) {
      if (p.where == devices[d]) spans_.push_back(CopyQueue::Span{p.at, slot + at, p.len});
      at += p.len;
    }
    DMX_RETURN_IF_ERROR(staging_copy_list(each, false));
    if (d > 0) {
      DMX_ASSIGN_OR_RETURN(uint64_t f, each->record());
      DMX_RETURN_IF_ERROR(each->wait(f, Deadline::after(std::chrono::seconds(30))));
    }
  }
  DMX_ASSIGN_OR_RETURN(*fence, q->record());
  return Status();
}

Status Stream::finish_payload() {
  in_payload_ = false;
  stats_.frames_received.fetch_add(1, std::memory_order_relaxed);
  stats_.bytes_received.fetch_add(rx_.payload_len, std::memory_order_relaxed);
  if (wire::is_chunk(rx_.type)) burst_data_ += rx_.payload_len;
  if (rx_plan_.kind == RxPlan::Kind::kDevice && rx_.payload_len > 0) {
    DMX_TRACE_POINT("st.h2d");
    [[maybe_unused]] auto t0 = Clock::now();
    DMX_ASSIGN_OR_RETURN(CopyQueue * q, queue_for(rx_plan_.where));
    const size_t len = rx_.payload_len - rx_plan_at_;  // after a prefix: the rest
    uint64_t ticket = 0, fence = 0;
    if (!rx_plan_.pieces.empty()) {
      DMX_RETURN_IF_ERROR(scatter_from_slot(q, &fence));
    } else {
      DMX_RETURN_IF_ERROR(staging_copy(q, rx_plan_.dst, slots_.at(rx_slot_), len, config_.push_rx_max, false));
      if (checks(rx_) && (rx_.flags & wire::kFlagChecksum)) {
        DMX_ASSIGN_OR_RETURN(ticket, q->checksum(rx_plan_.dst, len));
      }
      DMX_ASSIGN_OR_RETURN(fence, q->record());
    }
    DMX_TRACE_POINT("st.h2d.issued");
    DMX_TRACE_SPAN("h2d", this, t0);
    stats_.h2d_copies.fetch_add(rx_plan_.pieces.empty() ? 1 : rx_plan_.pieces.size(), std::memory_order_relaxed);
    stats_.h2d_bytes.fetch_add(len, std::memory_order_relaxed);
    pending_rx_.push_back(PendingRx{rx_, std::move(rx_plan_), rx_slot_, fence, q, ticket});
    rx_slot_ = -1;
    rx_plan_ = RxPlan();
    return Status();
  }
  RxPlan plan = std::move(rx_plan_);
  rx_plan_ = RxPlan();
  if (checks(rx_) && (rx_.flags & wire::kFlagChecksum)) {
    // Device payloads of zero bytes land here too: nothing moved, the CRC of nothing.
    const void* landed = plan.kind == RxPlan::Kind::kControl ? plan.control.data() : plan.dst;
    if (plan.kind == RxPlan::Kind::kHost || plan.kind == RxPlan::Kind::kControl || rx_.payload_len == 0) {
      plan.crc_checked = true;
      plan.landed_crc = rx_.payload_len == 0 ? 0 : crc32c::of(landed, rx_.payload_len);
    }
  }
  return host_->on_landed(config_.index, rx_, plan);
}

// Hands finished device copies to the host, in order. block: wait for at least one.
Status Stream::reap_rx(bool block, bool* progress) {
  while (!pending_rx_.empty()) {
    PendingRx& p = pending_rx_.front();
    if (block) {
      DMX_RETURN_IF_ERROR(p.queue->wait(p.fence, Deadline::after(std::chrono::seconds(30))));
      block = false;
    } else {
      DMX_ASSIGN_OR_RETURN(bool done, p.queue->done(p.fence));
      if (!done) return Status();
    }
    PendingRx ready = std::move(p);
    pending_rx_.pop_front();
    if (ready.crc_ticket != 0) {
      ready.plan.crc_checked = true;
      ready.plan.landed_crc = ready.queue->checksum_result(ready.crc_ticket);
    }
    free_rx_slots_.push_back(ready.slot);
    *progress = true;
    DMX_TRACE_POINT("st.h2d.done");
    DMX_TRACE_AT("h2d.ok", this);  // seen done, in issue order
    DMX_RETURN_IF_ERROR(host_->on_landed(config_.index, ready.header, ready.plan));
  }
  return Status();
}

namespace {

// A chunk of a bulk host transfer (RxPlan::bulk) is read through a small buffer that stays in the
// worker's cache, then copied into its destination with non-temporal stores: the kernel's copy
// would read each destination line from memory before writing it. Kernel TCP moving 8 x 256 MiB
// on the GPU machine went from 18.5-19.1 to 22.5-24.2 GB/s so (bench/tcp_ref, docs/performance.md).
// Not below: a small destination is likely in cache, and the reader's next.
constexpr size_t kBounceSize = size_t{256} << 10;

char* bounce_buffer() {
  // One per thread: a worker turns one stream at a time.
  thread_local std::vector<char> buf(kBounceSize);
  return buf.data();
}

}  // namespace

// Reads into the next header, or into the payload's destination. Headers are read through a small
// read-ahead buffer that also takes what follows them (a small frame: header and payload in one
// read instead of two); a payload's remaining bytes then come from the buffer first and are read
// straight into their destination after. A short read means the conduit has nothing more for now:
// the round ends without another read that would find nothing (a syscall per frame on sockets).
Status Stream::step_rx(Io* io) {
  *io = Io::kIdle;
  bool drained = false;  // a short read in this round: the conduit has nothing more for now
  for (int rounds = 0; rounds < 64; ++rounds) {
    void* dst;
    size_t want;
    if (!in_payload_) {
      dst = rx_header_ + rx_header_got_;
      want = wire::kHeaderSize - rx_header_got_;
    } else {
      size_t left = rx_.payload_len - rx_payload_got_;
      const size_t at = rx_payload_got_ - rx_plan_at_;
      switch (rx_plan_.kind) {
        case RxPlan::Kind::kHost:
          if (rx_plan_.pieces.empty()) {
            dst = static_cast<char*>(rx_plan_.dst) + at;
          } else {
            const Piece& p = rx_plan_.pieces[rx_piece_];
            dst = static_cast<char*>(p.at) + rx_piece_got_;
            left = p.len - rx_piece_got_;
          }
          break;
        case RxPlan::Kind::kDevice: dst = static_cast<char*>(slots_.at(rx_slot_)) + at; break;
        case RxPlan::Kind::kControl:
          dst = rx_plan_.control.data() + at;
          left = rx_plan_.control.size() - at;
          break;
        default:
          dst = scratch_.data();
          left = std::min(left, scratch_.size());
          break;
      }
      want = left;
    }
    size_t got = 0;
    if (ahead_pos_ < ahead_len_) {  // bytes read ahead come first
      got = std::min(want, ahead_len_ - ahead_pos_);
      std::memcpy(dst, rx_ahead_.data() + ahead_pos_, got);
      ahead_pos_ += got;
    } else {
      if (drained) return Status();
      bool read_ahead = !in_payload_;
      bool bounce = in_payload_ && rx_plan_.kind == RxPlan::Kind::kHost && rx_plan_.bulk;
      bool scatter = in_payload_ && rx_plan_.kind == RxPlan::Kind::kHost && !rx_plan_.pieces.empty();
      size_t asked = read_ahead ? rx_ahead_.size() : bounce ? std::min(want, kBounceSize) : want;
      if (scatter) {  // the rest of the table's pieces in one read
        rx_iov_.clear();
        rx_iov_.push_back({dst, want});
        // Bounded: a read that finds less than asked costs the kernel every iovec it was given.
        for (size_t i = rx_piece_ + 1;
             i < rx_plan_.pieces.size() && rx_iov_.size() < kScatterIov && asked < kScatterBytes; ++i) {
          rx_iov_.push_back({rx_plan_.pieces[i].at, rx_plan_.pieces[i].len});
          asked += rx_plan_.pieces[i].len;
        }
      }
      auto t0 = Clock::now();
      Result<size_t> k = scatter ? conduit_->readv(rx_iov_)
                                 : conduit_->read(read_ahead ? rx_ahead_.data() : bounce ? bounce_buffer() : dst, asked);
      stats_.ns_recv.fetch_add(ns_since(t0), std::memory_order_relaxed);
      if (!k.ok()) return k.status();
      if (*k > 0) DMX_TRACE_SPAN("rd", this, t0);  // not the empty ones (busy poll)
      drained = last_read_short_ = *k < asked;
      if (*k == 0) return Status();
      if (read_ahead) {
        ahead_pos_ = 0;
        ahead_len_ = *k;
        continue;  // taken from the buffer in the next round
      }
      if (bounce) {
        [[maybe_unused]] auto t1 = Clock::now();
        stream_copy(dst, bounce_buffer(), *k);
        DMX_TRACE_SPAN("bounce", this, t1);  // into the destination
      }
      got = *k;
    }
    *io = Io::kProgress;
    burst_bytes_ += got;
    last_rx_ = Clock::now();
    if (!in_payload_) {
      if (rx_header_got_ == 0) rx_frame_start_ = last_rx_;  // a frame begins: its clock starts
      rx_header_got_ += got;
      if (rx_header_got_ < wire::kHeaderSize) continue;
      rx_header_got_ = 0;
      DMX_ASSIGN_OR_RETURN(rx_, wire::decode_header(rx_header_, config_.limits));
      if (rx_.type == wire::FrameType::kKeepalive && rx_.a0 == 1) push_keepalive(false);  // a probe
      if (config_.index == 0)
        DMX_TRACE_POINT(rx_.type == wire::FrameType::kEager      ? "s0.in.eager"
                        : rx_.type == wire::FrameType::kPathDone ? "s0.in.pathdone"
                                                                 : "s0.in.other");
      DMX_RETURN_IF_ERROR(begin_payload());
    } else {
      rx_payload_got_ += got;
      if (rx_plan_.kind == RxPlan::Kind::kHost && !rx_plan_.pieces.empty()) {
        for (size_t left = got; left > 0;) {  // a read may fill several pieces
          size_t take = std::min(left, rx_plan_.pieces[rx_piece_].len - rx_piece_got_);
          left -= take;
          if ((rx_piece_got_ += take) == rx_plan_.pieces[rx_piece_].len) {
            ++rx_piece_;
            rx_piece_got_ = 0;
          }
        }
      }
      if (rx_plan_.kind == RxPlan::Kind::kControl && rx_plan_.prefix != 0 && rx_payload_got_ == rx_plan_.prefix)
        DMX_RETURN_IF_ERROR(begin_rest());
      else if (rx_payload_got_ == rx_.payload_len)
        DMX_RETURN_IF_ERROR(finish_payload());
    }
  }
  return Status();
}

// A peer that sends a byte now and then never falls silent for peer_timeout, yet holds the stream
// (and everything queued behind the frame) forever. So a frame also has a budget from its first
// byte: peer_timeout, plus its payload at kMinFrameRate — a 64 MiB chunk gets 256 s more.
Status Stream::check_frame_budget(Clock::time_point now) const {
  if (rx_header_got_ == 0 && !in_payload_) return Status();
  auto budget = config_.peer_timeout;
  if (in_payload_)
    budget += std::chrono::microseconds(uint64_t{rx_.payload_len} * 1'000'000 / kMinFrameRate);
  auto took = now - rx_frame_start_;
  if (took <= budget) return Status();
  size_t got = in_payload_ ? wire::kHeaderSize + rx_payload_got_ : rx_header_got_;
  size_t size = wire::kHeaderSize + (in_payload_ ? rx_.payload_len : 0);
  return Status(Code::kPeerFailed,
                fmt::format("peer sent only {} of {} bytes of a frame in {} ms (stream {}, budget {} ms: "
                            "peer_timeout plus the payload at {} KiB/s); closing it",
                            got, in_payload_ ? fmt::format("{}", size) : fmt::format("at least {}", size),
                            std::chrono::duration_cast<std::chrono::milliseconds>(took).count(), config_.index,
                            std::chrono::duration_cast<std::chrono::milliseconds>(budget).count(),
                            kMinFrameRate >> 10));
}

}  // namespace dmx::stream
