// The shm data path: two lock-free slot rings in a shared memfd, pipelined chunk copies, eventfd
// doorbells. See ring.h for the layout and the trust model.
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "core/checked.h"
#include "core/log.h"
#include "core/stream_copy.h"
#include "core/sys.h"
#include "transport/shm/link_impl.h"

namespace dmx::shm {
namespace {

constexpr std::chrono::seconds kDrainDeadline{5};  // device copies to settle after a failure
constexpr uint32_t kIdleRoundsPerPeerCheck = 256;

}  // namespace

LinkImpl::LinkImpl(UnixChannel channel, const LinkOptions& options, const Layout& layout, char* base, int side)
    : channel_(std::move(channel)), options_(options), layout_(layout), base_(base), side_(side) {
  auto* ctl = reinterpret_cast<RingControl*>(base_ + layout_.control);
  tx_ctl_ = &ctl[side_];
  rx_ctl_ = &ctl[1 - side_];
  bells_ = reinterpret_cast<Doorbells*>(base_ + layout_.doorbells);
}

LinkImpl::~LinkImpl() {
  // Device copies may still read or write our bounce buffers: let them finish first.
  bool over = queues_.drain(Deadline::after(kDrainDeadline)).ok();
  for (auto& c : tx_chunks_) give_back(c.bounce, over);
  for (auto& c : rx_copies_) give_back(c.bounce, over);
  for (auto& b : orphans_) give_back(b, over);
  bells_->sleeping[side_].v.store(0, std::memory_order_relaxed);
  // No device copy touches the slots and nothing pinned them: unmapping waits for no device.
  ::munmap(base_, layout_.total);
}

Status LinkImpl::set_doorbells(UniqueFd mine, UniqueFd peers) {
  my_bell_ = std::move(mine);
  peer_bell_ = std::move(peers);
  // The peer's fd must be an eventfd: writing to anything else (a pipe) could block us.
  char target[64] = {};
  std::string link = fmt::format("/proc/self/fd/{}", peer_bell_.get());
  ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
  if (n <= 0 || std::string_view(target) != "anon_inode:[eventfd]")
    return Status(Code::kProtocol, fmt::format("shm setup: doorbell fd from peer {} is not an eventfd ('{}')",
                                               peer_name(), target))
        .with_peer(peer_name());
  int flags = ::fcntl(peer_bell_.get(), F_GETFL);
  if (flags < 0 || ::fcntl(peer_bell_.get(), F_SETFL, flags | O_NONBLOCK) != 0)
    return errno_status("fcntl(peer doorbell, O_NONBLOCK)", errno);
  return Status();
}

char* LinkImpl::slot_data(int ring, uint64_t count) const {
  return base_ + layout_.data_offset(ring, static_cast<uint32_t>(count % layout_.slots));
}
SlotHeader* LinkImpl::slot_header(int ring, uint64_t count) const {
  return reinterpret_cast<SlotHeader*>(base_ + layout_.header_offset(ring, static_cast<uint32_t>(count % layout_.slots)));
}

void LinkImpl::host_copy(void* dst, const void* src, size_t len, bool bulk) {
  if (options_.crew != nullptr)
    options_.crew->copy(dst, src, len, bulk);
  else if (bulk)
    stream_copy(dst, src, len);
  else
    std::memcpy(dst, src, len);
}

Result<LinkImpl::SlotCopy> LinkImpl::copy_slot(void* dst, const void* src, size_t len, MemSpec user, bool to_slot,
                                               bool bulk) {
  SlotCopy c;
  if (len == 0) return c;
  if (!user.is_device()) {
    host_copy(dst, src, len, bulk);
    ++stats_.host_copies;
    return c;
  }
  DMX_ASSIGN_OR_RETURN(CopyQueue * queue, queues_.get(user));
  DMX_ASSIGN_OR_RETURN(c.bounce.pool, BouncePool::of(user));
  DMX_ASSIGN_OR_RETURN(bool got, c.bounce.pool->take(BouncePool::pieces_for(len), &c.bounce.pieces));
  if (!got) {
    c.waiting = true;
    starved_ = true;
    return c;
  }
  c.queue = queue;
  // Piece by piece: out of a slot, the device copies one piece while we fill the next.
  Status s;
  for (size_t i = 0, off = 0; s.ok() && off < len; ++i, off += BouncePool::kPiece) {
    const size_t n = std::min(BouncePool::kPiece, len - off);
    void* piece = c.bounce.pieces[i];
    if (to_slot) {
      s = queue->to_host(piece, static_cast<const char*>(src) + off, n);
    } else {
      host_copy(piece, static_cast<const char*>(src) + off, n, /*bulk=*/false);
      s = queue->to_device(static_cast<char*>(dst) + off, piece, n);
    }
  }
  if (s.ok()) {
    auto fence = queue->record();
    if (fence.ok()) c.fence = *fence;
    else s = fence.status();
  }
  if (!s.ok()) {
    orphans_.push_back(std::move(c.bounce));  // copies may be queued into them: given back after a drain
    return s;
  }
  ++stats_.device_copies;
  return c;
}

void LinkImpl::copy_from_bounce(char* slot, const Bounce& b, size_t len) {
  for (size_t i = 0, off = 0; off < len; ++i, off += BouncePool::kPiece)
    host_copy(slot + off, b.pieces[i], std::min(BouncePool::kPiece, len - off), /*bulk=*/false);
}

void LinkImpl::host_copy(std::span<const CopyCrew::Segment> segments, bool bulk) {
  if (options_.crew != nullptr) {
    options_.crew->copy(segments, bulk);
    return;
  }
  for (const CopyCrew::Segment& g : segments) host_copy(g.dst, g.src, g.n, bulk);
}

void LinkImpl::gather(SendOp& op, char* slot, size_t len) {
  segments_.clear();
  for (size_t done = 0; done < len;) {
    const MemRegion& r = op.pieces[op.at];
    size_t n = std::min(len - done, r.size - op.off);
    segments_.push_back({slot + done, static_cast<const char*>(r.ptr) + op.off, n});
    done += n;
    op.off += n;
    if (op.off == r.size) {
      ++op.at;
      op.off = 0;
    }
  }
  host_copy(segments_, /*bulk=*/false);
  ++stats_.host_copies;
}

Result<size_t> LinkImpl::scatter(MsgId id, RecvOp& op, const char* slot, size_t len, size_t done, bool bulk) {
  // Host pieces are copied together at the end (by the crew, if any), device pieces as met.
  segments_.clear();
  Status failed;
  while (done < len) {
    // The message's total is the pieces' sum (checked at its first chunk): a piece is left.
    const MemRegion& r = op.pieces[op.at];
    size_t n = std::min(len - done, r.size - op.off);
    if (n > 0 && !r.where.is_device()) {
      segments_.push_back({static_cast<char*>(r.ptr) + op.off, slot + done, n});
    } else if (n > 0) {
      auto c = copy_slot(static_cast<char*>(r.ptr) + op.off, slot + done, n, r.where, /*to_slot=*/false, bulk);
      if (!c.ok()) {
        failed = c.status();
        break;
      }
      if (c->waiting) break;
      if (c->queue != nullptr) {
        ++op.outstanding;
        rx_copies_.push_back(RxCopy{c->queue, c->fence, id, std::move(c->bounce)});
      }
    }
    done += n;
    op.off += n;
    op.received += n;
    if (op.off == r.size) {
      ++op.at;
      op.off = 0;
    }
  }
  if (!segments_.empty()) {
    host_copy(segments_, bulk);
    ++stats_.host_copies;
  }
  if (!failed.ok()) return failed;
  return done;
}

void LinkImpl::give_back(Bounce& b, bool copies_over) {
  if (b.pool == nullptr || b.pieces.empty()) return;
  if (copies_over) {
    b.pool->give(b.pieces);
  } else {
    DMX_LOG_WARN("shm link to {}: {} bounce buffers taken out of the pool for good: their device copies did not "
                 "finish",
                 peer_name(), b.pieces.size());
  }
  b.pieces.clear();
}

Status LinkImpl::post_send(MsgId id, MemRegion src) {
  if (src.ptr == nullptr && src.size != 0) return Status(Code::kInvalidArgument, "shm post_send: null buffer");
  if (src.where.is_device()) DMX_RETURN_IF_ERROR(mem_available(src.where));
  if (!error_.ok()) {
    failed_.push_back(Completion{id, Completion::kSend, error_, 0});
    return Status();
  }
  sends_.push_back(SendOp{id, src, 0});
  return Status();
}

Status LinkImpl::post_recv(MsgId id, MemRegion dst) {
  if (dst.ptr == nullptr && dst.size != 0) return Status(Code::kInvalidArgument, "shm post_recv: null buffer");
  if (dst.where.is_device()) DMX_RETURN_IF_ERROR(mem_available(dst.where));
  if (recvs_.count(id) != 0)
    return Status(Code::kInvalidArgument, fmt::format("shm post_recv: message id {} is already posted", id));
  if (!error_.ok()) {
    failed_.push_back(Completion{id, Completion::kRecv, error_, 0});
    return Status();
  }
  recvs_.emplace(id, RecvOp{dst});
  return Status();
}

// A list's total, or why it is not one.
static Result<size_t> list_total(std::span<const MemRegion> pieces, std::string_view what) {
  if (pieces.empty()) return Status(Code::kInvalidArgument, fmt::format("shm {}: an empty list", what));
  uint64_t total = 0;
  for (const MemRegion& r : pieces) {
    if (r.ptr == nullptr && r.size != 0) return Status(Code::kInvalidArgument, fmt::format("shm {}: null piece", what));
    auto sum = checked_add(total, r.size);
    if (!sum) return Status(Code::kInvalidArgument, fmt::format("shm {}: pieces over 2^64 bytes", what));
    total = *sum;
  }
  return static_cast<size_t>(total);
}

Status LinkImpl::post_send_list(MsgId id, std::vector<MemRegion> srcs) {
  DMX_ASSIGN_OR_RETURN(size_t total, list_total(srcs, "post_send_list"));
  for (const MemRegion& r : srcs)
    if (r.where.is_device())
      return Status(Code::kInvalidArgument, fmt::format("shm post_send_list: a piece of {}: lists gather host memory",
                                                        to_string(r.where)));
  if (!error_.ok()) {
    failed_.push_back(Completion{id, Completion::kSend, error_, 0});
    return Status();
  }
  sends_.push_back(SendOp{id, MemRegion{nullptr, total, srcs[0].where}, 0, std::move(srcs)});
  return Status();
}

Status LinkImpl::post_recv_list(MsgId id, std::vector<MemRegion> dsts) {
  DMX_ASSIGN_OR_RETURN(size_t total, list_total(dsts, "post_recv_list"));
  for (const MemRegion& r : dsts)
    if (r.where.is_device()) DMX_RETURN_IF_ERROR(mem_available(r.where));
  if (recvs_.count(id) != 0)
    return Status(Code::kInvalidArgument, fmt::format("shm post_recv_list: message id {} is already posted", id));
  if (!error_.ok()) {
    failed_.push_back(Completion{id, Completion::kRecv, error_, 0});
    return Status();
  }
  RecvOp op{MemRegion{nullptr, total, dsts[0].where}};
  op.pieces = std::move(dsts);
  recvs_.emplace(id, std::move(op));
  return Status();
}

Status LinkImpl::post_discard(MsgId id, size_t bytes) {
  if (recvs_.count(id) != 0)
    return Status(Code::kInvalidArgument, fmt::format("shm post_discard: message id {} is already posted", id));
  if (!error_.ok()) {
    failed_.push_back(Completion{id, Completion::kRecv, error_, 0});
    return Status();
  }
  RecvOp op{MemRegion{nullptr, bytes, {}}};
  op.discard = true;
  recvs_.emplace(id, op);
  return Status();
}

Status LinkImpl::check_peer(std::vector<Completion>* out) {
  if (!error_.ok()) return error_;
  Status s = channel_.check_peer();
  if (s.ok()) return error_;
  // What the peer published before it went away is still good: take it, then fail the rest.
  rx_step(out);
  if (error_.ok() && pending() == 0) {
    // An idle link whose peer went away (often a peer that closed normally): the end, not news.
    error_ = s.with_peer(peer_name()).with_origin("shm");
    DMX_LOG_DEBUG("shm link: peer {} hung up with nothing pending", peer_name());
  } else if (error_.ok()) {
    fail(s, out);
  }
  return error_;
}

Status LinkImpl::corrupt(std::string_view what) {
  return Status(Code::kProtocol, fmt::format("shm ring corrupt: {} (peer {})", what, peer_name())).with_peer(peer_name());
}

void LinkImpl::ring_peer() {
  // Pairs with the sleeper's seq_cst store of its flag followed by its re-check of the rings.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (bells_->sleeping[1 - side_].v.load(std::memory_order_relaxed) != 0) {
    uint64_t one = 1;
    if (::write(peer_bell_.get(), &one, sizeof one) == sizeof one) ++stats_.wakeups_sent;
  }
}

// Producer: publish finished chunks in order, then fill free slots from the send queue.
bool LinkImpl::tx_step(std::vector<Completion>* out) {
  bool moved = false;
  uint64_t t = tx_ctl_->tail.v.load(std::memory_order_acquire);
  if (t != peer_tail_) {
    if (t < peer_tail_ || t > tx_head_) {
      fail(corrupt(fmt::format("consumer tail {} outside [{}, {}]", t, peer_tail_, tx_head_)), out);
      return true;
    }
    peer_tail_ = t;
    moved = true;
  }
  uint64_t published = tx_head_;
  if (!publish_ready(out)) return true;
  while (!sends_.empty() && tx_reserved_ - peer_tail_ < layout_.slots) {
    SendOp& op = sends_.front();
    size_t len = std::min(layout_.slot_size, op.src.size - op.assigned);
    char* data = slot_data(side_, tx_reserved_);
    TxChunk chunk{nullptr, 0, op.id, len, op.assigned + len == op.src.size, op.src.size, nullptr, {}};
    Result<SlotCopy> copied = SlotCopy{};
    if (op.pieces.empty())
      copied = copy_slot(data, static_cast<const char*>(op.src.ptr) + op.assigned, len, op.src.where,
                         /*to_slot=*/true, /*bulk=*/false);
    else
      gather(op, data, len);
    if (!copied.ok()) {
      fail(copied.status(), out);
      return true;
    }
    if (copied->waiting) break;  // no bounce buffer: ours come back as our copies finish
    chunk.queue = copied->queue;
    chunk.fence = copied->fence;
    if (chunk.queue != nullptr) {
      chunk.slot = data;
      chunk.bounce = std::move(copied->bounce);
    }
    SlotHeader* h = slot_header(side_, tx_reserved_);
    h->msg_id.store(op.id, std::memory_order_relaxed);
    h->offset.store(op.assigned, std::memory_order_relaxed);
    h->total.store(op.src.size, std::memory_order_relaxed);
    h->len.store(len, std::memory_order_relaxed);
    ++tx_reserved_;
    op.assigned += len;
    const bool host = chunk.queue == nullptr, last = chunk.last;
    tx_chunks_.push_back(std::move(chunk));
    if (last) sends_.pop_front();
    moved = true;
    // Publish each host chunk as soon as it is copied, so that the consumer copies out of one slot
    // while we fill the next (the pipeline), instead of after a whole ring's worth.
    if (host && tx_chunks_.size() == 1 && !publish_ready(out)) return true;
  }
  // Host chunks are complete as soon as they are copied: publish them in the same step.
  if (!publish_ready(out)) return true;
  return moved || tx_head_ != published;
}

// Publishes the chunks at the front whose copies have finished, in ring order. False when the link
// failed.
bool LinkImpl::publish_ready(std::vector<Completion>* out) {
  uint64_t stored = tx_head_;
  while (!tx_chunks_.empty()) {
    TxChunk& c = tx_chunks_.front();
    bool bounced = c.queue != nullptr;
    if (bounced) {
      auto done = c.queue->done(c.fence);
      if (!done.ok()) {
        fail(done.status(), out);
        return false;
      }
      if (!*done) break;
      // The device wrote the bounce buffers; into the slot now, before the head's release store
      // below publishes it (the slot's header was written when the slot was taken).
      copy_from_bounce(c.slot, c.bounce, c.bytes);
      give_back(c.bounce, true);
    }
    ++tx_head_;
    stats_.bytes_sent += c.bytes;
    if (c.last) out->push_back(Completion{c.id, Completion::kSend, Status(), c.msg_bytes});
    tx_chunks_.pop_front();
    if (bounced) {  // let the peer copy this one out while we copy the next
      tx_ctl_->head.v.store(tx_head_, std::memory_order_release);
      ring_peer();
      stored = tx_head_;
    }
  }
  if (tx_head_ != stored) {
    tx_ctl_->head.v.store(tx_head_, std::memory_order_release);
    ring_peer();
  }
  return true;
}

void LinkImpl::maybe_complete_recv(MsgId id, std::vector<Completion>* out) {
  auto it = recvs_.find(id);
  if (it == recvs_.end()) return;
  RecvOp& op = it->second;
  if (op.started && op.received == op.total && op.outstanding == 0) {
    stats_.bytes_received += op.total;
    out->push_back(Completion{id, Completion::kRecv, Status(), op.total});
    recvs_.erase(it);
  }
}

// Consumer: credit device copies that finished, in order; then consume newly published slots.
// Every slot is released as soon as it is consumed (device copies go out of bounce buffers).
bool LinkImpl::rx_step(std::vector<Completion>* out) {
  bool moved = false;
  while (!rx_copies_.empty()) {
    RxCopy& c = rx_copies_.front();
    auto done = c.queue->done(c.fence);
    if (!done.ok()) {
      fail(done.status(), out);
      return true;
    }
    if (!*done) break;
    give_back(c.bounce, true);
    MsgId id = c.id;
    rx_copies_.pop_front();
    moved = true;
    if (auto it = recvs_.find(id); it != recvs_.end()) {
      --it->second.outstanding;
      maybe_complete_recv(id, out);
    }
  }
  uint64_t h = rx_ctl_->head.v.load(std::memory_order_acquire);
  if (h != peer_head_) {
    if (h < peer_head_ || h - rx_tail_ > layout_.slots) {
      fail(corrupt(fmt::format("producer head {} outside [{}, {}]", h, peer_head_, rx_tail_ + layout_.slots)), out);
      return true;
    }
    peer_head_ = h;
  }
  while (rx_read_ < peer_head_) {
    SlotHeader* hd = slot_header(1 - side_, rx_read_);
    // Copy the header once; never read the shared copy again for this chunk.
    const MsgId id = hd->msg_id.load(std::memory_order_relaxed);
    const uint64_t offset = hd->offset.load(std::memory_order_relaxed);
    const uint64_t total = hd->total.load(std::memory_order_relaxed);
    const uint64_t len = hd->len.load(std::memory_order_relaxed);
    if (len > layout_.slot_size || offset > total || len > total - offset || (len == 0 && total != 0)) {
      fail(corrupt(fmt::format("slot {}: chunk [{}, +{}) of a {} B message (slot size {})", rx_read_, offset, len,
                               total, layout_.slot_size)),
           out);
      return true;
    }
    const char* data = slot_data(1 - side_, rx_read_);
    bool discard = false;
    if (auto d = discarding_.find(id); d != discarding_.end()) {
      if (len > d->second) {
        fail(corrupt(fmt::format("message {} runs past its announced length", id)), out);
        return true;
      }
      d->second -= len;
      if (d->second == 0) discarding_.erase(d);
      discard = true;
    } else {
      auto it = recvs_.find(id);
      if (it == recvs_.end()) break;  // not posted yet: wait (head-of-line)
      RecvOp& op = it->second;
      if (!op.started) {
        if (offset != 0) {
          fail(corrupt(fmt::format("message {} starts at offset {}", id, offset)), out);
          return true;
        }
        op.started = true;
        op.total = total;
        if (op.discard && total != op.dst.size) {
          fail(corrupt(fmt::format("message {} is {} B, announced as {} B", id, total, op.dst.size)), out);
          return true;
        }
        if (total > op.dst.size) {
          out->push_back(Completion{id, Completion::kRecv,
                                    Status(Code::kTruncated, fmt::format("shm recv: message {} of {} B into a {} B buffer",
                                                                         id, total, op.dst.size))
                                        .with_peer(peer_name()),
                                    total});
          recvs_.erase(it);
          if (total - len > 0) discarding_[id] = total - len;
          discard = true;
        }
      } else if (total != op.total || offset + rx_slot_done_ != op.received) {
        fail(corrupt(fmt::format("message {}: chunk at {} of {} B, expected at {} of {} B", id, offset, total,
                                 op.received, op.total)),
             out);
        return true;
      }
      if (!discard && op.discard) {  // (op is gone when the recv was truncated above)
        // Validated above like any chunk; nothing to copy: the slot is released below.
        op.received += len;
        maybe_complete_recv(id, out);
      } else if (!discard && !op.pieces.empty()) {
        auto done = scatter(id, op, data, len, rx_slot_done_, total >= options_.nt_receive_min);
        if (!done.ok()) {
          fail(done.status(), out);
          return true;
        }
        if (*done < len) {  // the bounce pool ran dry: the rest of this slot on a later pass
          rx_slot_done_ = *done;
          break;
        }
        rx_slot_done_ = 0;
        maybe_complete_recv(id, out);
      } else if (!discard) {
        char* dst = static_cast<char*>(op.dst.ptr) + offset;
        // Out of the ring into a large host destination with stores that skip the cache, as
        // glibc's memcpy does for large copies: each line is written without being read first.
        // The ring's slots, which the peer fills again at once, keep ordinary stores.
        auto copied = copy_slot(dst, data, len, op.dst.where, /*to_slot=*/false,
                                  total >= options_.nt_receive_min);
        if (!copied.ok()) {
          fail(copied.status(), out);
          return true;
        }
        // No bounce buffer: the slot waits (taken again, validated again, next round; what was
        // recorded of this message above holds for it then too).
        if (copied->waiting) break;
        op.received += len;
        if (copied->queue != nullptr) {
          ++op.outstanding;
          rx_copies_.push_back(RxCopy{copied->queue, copied->fence, id, std::move(copied->bounce)});
        } else {
          maybe_complete_recv(id, out);
        }
      }
    }
    ++rx_read_;
    moved = true;
    // The slot's bytes are where they go, or in a bounce buffer: give it back at once, so the
    // producer can refill it while we copy the next one.
    ++rx_tail_;
    rx_ctl_->tail.v.store(rx_tail_, std::memory_order_release);
    ring_peer();
  }
  return moved;
}

size_t LinkImpl::progress(std::vector<Completion>* out) {
  size_t before = out->size();
  while (!failed_.empty()) {
    out->push_back(std::move(failed_.front()));
    failed_.pop_front();
  }
  if (!error_.ok()) {
    if (pending() != 0) fail(error_, out);
    return out->size() - before;
  }
  starved_ = false;
  bool moved = rx_step(out);
  if (error_.ok()) moved |= tx_step(out);
  if (error_.ok() && (peer_hup_ || (!moved && ++idle_rounds_ >= kIdleRoundsPerPeerCheck))) {
    idle_rounds_ = 0;
    Status s = channel_.check_peer();
    if (!s.ok()) {
      // What the peer published before it went away is still good: take it, then fail the rest.
      rx_step(out);
      if (pending() != 0 && error_.ok()) fail(s, out);
    }
  }
  if (moved) idle_rounds_ = 0;
  return out->size() - before;
}

void LinkImpl::fail(Status status, std::vector<Completion>* out) {
  if (error_.ok()) {
    error_ = status.with_peer(peer_name()).with_origin("shm");
    DMX_LOG_WARN("shm link to peer {} failed: {}", peer_name(), error_.to_string());
  }
  // Completion returns buffer ownership: device copies into or out of user buffers must be over.
  bool over = queues_.drain(Deadline::after(kDrainDeadline)).ok();
  for (auto& op : sends_) out->push_back(Completion{op.id, Completion::kSend, error_, 0});
  sends_.clear();
  for (auto& c : tx_chunks_) {
    give_back(c.bounce, over);
    if (c.last) out->push_back(Completion{c.id, Completion::kSend, error_, 0});
  }
  tx_chunks_.clear();
  for (auto& [id, op] : recvs_) out->push_back(Completion{id, Completion::kRecv, error_, 0});
  recvs_.clear();
  for (auto& c : rx_copies_) give_back(c.bounce, over);
  rx_copies_.clear();
  for (auto& b : orphans_) give_back(b, over);
  orphans_.clear();
  discarding_.clear();
  rx_slot_done_ = 0;
  while (!failed_.empty()) {
    out->push_back(std::move(failed_.front()));
    failed_.pop_front();
  }
}

bool LinkImpl::has_work() {
  if (!error_.ok() || !failed_.empty()) return true;
  if (!tx_chunks_.empty() || !rx_copies_.empty() || starved_) return true;  // device copies to poll
  if (!sends_.empty() && tx_ctl_->tail.v.load(std::memory_order_acquire) != peer_tail_) return true;
  if (!recvs_.empty() && rx_ctl_->head.v.load(std::memory_order_acquire) != peer_head_) return true;
  if (!sends_.empty() && tx_reserved_ - peer_tail_ < layout_.slots) return true;
  return false;
}

bool LinkImpl::arm_wakeup() {
  // seq_cst store, then re-check: pairs with ring_peer()'s fence and load of this word.
  bells_->sleeping[side_].v.store(1, std::memory_order_seq_cst);
  return !has_work();
}

void LinkImpl::disarm_wakeup() {
  bells_->sleeping[side_].v.store(0, std::memory_order_relaxed);
  uint64_t drained;
  while (::read(my_bell_.get(), &drained, sizeof drained) == sizeof drained) {
  }
}

Status LinkImpl::wait(Deadline deadline) {
  if (pending() == 0) return Status();
  auto spin_end = Clock::now() + options_.spin;
  while (Clock::now() < spin_end) {
    if (has_work()) return Status();
    cpu_relax();
  }
  if (!tx_chunks_.empty() || !rx_copies_.empty() || starved_) {
    // Device copies in flight (ours, or other links' holding the bounce buffers we wait for):
    // nothing will ring us when they finish; yield and let the caller poll.
    std::this_thread::yield();
    return deadline.expired() ? Status(Code::kTimeout, "shm wait: deadline passed") : Status();
  }
  Status result;
  if (arm_wakeup()) {
    pollfd fds[2] = {{my_bell_.get(), POLLIN, 0}, {channel_.fd(), POLLRDHUP, 0}};
    int n = ::poll(fds, 2, deadline.poll_timeout_ms());
    if (n < 0 && errno != EINTR) {
      result = errno_status("poll(shm doorbell)", errno);
    } else if (n > 0 && (fds[1].revents & (POLLHUP | POLLRDHUP | POLLERR))) {
      peer_hup_ = true;
    } else if (n == 0 && deadline.expired()) {
      result = Status(Code::kTimeout, fmt::format("shm wait: nothing from peer {} by the deadline", peer_name()));
    }
  }
  disarm_wakeup();
  return result;
}

}  // namespace dmx::shm
