// The shm data path: two lock-free slot rings in a shared memfd, pipelined chunk copies, eventfd
// doorbells. See ring.h for the layout and the trust model.
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <thread>

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
  // Device copies may still read or write our mapping of the slots: let them finish first.
  (void)queues_.drain(Deadline::after(kDrainDeadline));
  bells_->sleeping[side_].v.store(0, std::memory_order_relaxed);
  // Unpinning waits until the device is idle (cudaHostUnregister), which it is not while a
  // persistent kernel of this process runs (the Lynx GPU workers): this runs on the stream worker
  // that close() waits for, so the unpin and unmap go on later, on a thread of their own.
  if (pinned_by_ != nullptr) unpin_and_unmap_later(pinned_by_, base_, layout_.total);
  else ::munmap(base_, layout_.total);
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

Result<LinkImpl::SlotCopy> LinkImpl::copy_slot(void* dst, const void* src, size_t len, MemSpec user, bool to_slot,
                                               bool bulk) {
  SlotCopy c;
  if (len == 0) return c;
  if (!user.is_device()) {
    if (options_.crew != nullptr)
      options_.crew->copy(dst, src, len, bulk);
    else if (bulk)
      stream_copy(dst, src, len);
    else
      std::memcpy(dst, src, len);
    ++stats_.host_copies;
    return c;
  }
  DMX_ASSIGN_OR_RETURN(c.queue, queue_for(user));
  DMX_RETURN_IF_ERROR(to_slot ? c.queue->to_host(dst, src, len) : c.queue->to_device(dst, src, len));
  DMX_ASSIGN_OR_RETURN(c.fence, c.queue->record());
  ++stats_.device_copies;
  return c;
}

Result<CopyQueue*> LinkImpl::queue_for(MemSpec where) {
  bool made = false;
  DMX_ASSIGN_OR_RETURN(CopyQueue * raw, queues_.get(where, &made));
  if (!made) return raw;
  // The first device copy pins our mapping of the slots (once, for every device): copies between
  // device memory and pageable memory are synchronous and several times slower.
  DMX_ASSIGN_OR_RETURN(MemoryBackend * backend, backend_for(where));
  if (pinned_by_ == nullptr && !pin_failed_) {
    if (Status s = backend->pin_host(base_, layout_.total); s.ok()) {
      pinned_by_ = backend;
    } else {
      pin_failed_ = true;
      DMX_LOG_WARN("shm link to {}: slots stay pageable, device copies through them will be slow: {}", peer_name(),
                   s.to_string());
    }
  }
  return raw;
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
    const char* src = static_cast<const char*>(op.src.ptr) + op.assigned;
    TxChunk chunk{nullptr, 0, op.id, len, op.assigned + len == op.src.size, op.src.size};
    auto copied = copy_slot(data, src, len, op.src.where, /*to_slot=*/true, /*bulk=*/false);
    if (!copied.ok()) {
      fail(copied.status(), out);
      return true;
    }
    chunk.queue = copied->queue;
    chunk.fence = copied->fence;
    SlotHeader* h = slot_header(side_, tx_reserved_);
    h->msg_id.store(op.id, std::memory_order_relaxed);
    h->offset.store(op.assigned, std::memory_order_relaxed);
    h->total.store(op.src.size, std::memory_order_relaxed);
    h->len.store(len, std::memory_order_relaxed);
    ++tx_reserved_;
    op.assigned += len;
    tx_chunks_.push_back(chunk);
    if (chunk.last) sends_.pop_front();
    moved = true;
    // Publish each host chunk as soon as it is copied, so that the consumer copies out of one slot
    // while we fill the next (the pipeline), instead of after a whole ring's worth.
    if (chunk.queue == nullptr && tx_chunks_.size() == 1 && !publish_ready(out)) return true;
  }
  // Host chunks are complete as soon as they are copied: publish them in the same step.
  if (!publish_ready(out)) return true;
  return moved || tx_head_ != published;
}

// Publishes the chunks at the front whose copies have finished, in ring order. False when the link
// failed.
bool LinkImpl::publish_ready(std::vector<Completion>* out) {
  uint64_t before = tx_head_;
  while (!tx_chunks_.empty()) {
    TxChunk& c = tx_chunks_.front();
    if (c.queue != nullptr) {
      auto done = c.queue->done(c.fence);
      if (!done.ok()) {
        fail(done.status(), out);
        return false;
      }
      if (!*done) break;
    }
    ++tx_head_;
    stats_.bytes_sent += c.bytes;
    if (c.last) out->push_back(Completion{c.id, Completion::kSend, Status(), c.msg_bytes});
    tx_chunks_.pop_front();
  }
  if (tx_head_ != before) {
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

// Consumer: release slots whose copies finished, in order; then consume newly published slots.
bool LinkImpl::rx_step(std::vector<Completion>* out) {
  bool moved = false;
  uint64_t released = rx_tail_;
  while (!rx_chunks_.empty()) {
    RxChunk& c = rx_chunks_.front();
    if (c.queue != nullptr) {
      auto done = c.queue->done(c.fence);
      if (!done.ok()) {
        fail(done.status(), out);
        return true;
      }
      if (!*done) break;
      auto it = recvs_.find(c.id);
      if (it != recvs_.end()) --it->second.outstanding;
    }
    ++rx_tail_;
    MsgId id = c.id;
    bool credit = c.queue != nullptr && !c.discard;
    rx_chunks_.pop_front();
    if (credit) maybe_complete_recv(id, out);
  }
  if (rx_tail_ != released) {
    rx_ctl_->tail.v.store(rx_tail_, std::memory_order_release);
    ring_peer();
    moved = true;
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
    RxChunk chunk{nullptr, 0, id, false};
    if (auto d = discarding_.find(id); d != discarding_.end()) {
      if (len > d->second) {
        fail(corrupt(fmt::format("message {} runs past its announced length", id)), out);
        return true;
      }
      d->second -= len;
      if (d->second == 0) discarding_.erase(d);
      chunk.discard = true;
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
          chunk.discard = true;
        }
      } else if (total != op.total || offset != op.received) {
        fail(corrupt(fmt::format("message {}: chunk at {} of {} B, expected at {} of {} B", id, offset, total,
                                 op.received, op.total)),
             out);
        return true;
      }
      if (!chunk.discard && op.discard) {  // (op is gone when the recv was truncated above)
        // Validated above like any chunk; nothing to copy: the slot is released below.
        chunk.discard = true;
        op.received += len;
        maybe_complete_recv(id, out);
      } else if (!chunk.discard) {
        char* dst = static_cast<char*>(op.dst.ptr) + offset;
        // Out of the ring into a large host destination with stores that skip the cache, as
        // glibc's memcpy does for large copies: each line is written without being read first.
        // The ring's slots, which the peer fills again at once, keep ordinary stores.
        auto copied = copy_slot(dst, data, len, op.dst.where, /*to_slot=*/false, total >= kBulkMessage);
        if (!copied.ok()) {
          fail(copied.status(), out);
          return true;
        }
        chunk.queue = copied->queue;
        chunk.fence = copied->fence;
        if (chunk.queue != nullptr) ++op.outstanding;
        op.received += len;
        if (chunk.queue == nullptr) maybe_complete_recv(id, out);
      }
    }
    ++rx_read_;
    moved = true;
    if (chunk.queue == nullptr && rx_chunks_.empty()) {
      // Nothing in flight before it: give the slot back at once, so the producer can refill it
      // while we copy the next one.
      ++rx_tail_;
      rx_ctl_->tail.v.store(rx_tail_, std::memory_order_release);
      ring_peer();
    } else {
      rx_chunks_.push_back(chunk);
    }
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
  (void)queues_.drain(Deadline::after(kDrainDeadline));
  for (auto& op : sends_) out->push_back(Completion{op.id, Completion::kSend, error_, 0});
  sends_.clear();
  for (auto& c : tx_chunks_)
    if (c.last) out->push_back(Completion{c.id, Completion::kSend, error_, 0});
  tx_chunks_.clear();
  for (auto& [id, op] : recvs_) out->push_back(Completion{id, Completion::kRecv, error_, 0});
  recvs_.clear();
  rx_chunks_.clear();
  discarding_.clear();
  while (!failed_.empty()) {
    out->push_back(std::move(failed_.front()));
    failed_.pop_front();
  }
}

bool LinkImpl::has_work() {
  if (!error_.ok() || !failed_.empty()) return true;
  if (!tx_chunks_.empty() || !rx_chunks_.empty()) return true;  // device copies to poll
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
  if (!tx_chunks_.empty() || !rx_chunks_.empty()) {
    // Device copies in flight: nothing will ring us when they finish; yield and let the caller poll.
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
