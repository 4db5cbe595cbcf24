// ShmLink's implementation (private to src/transport/shm).
#pragma once

#include <deque>
#include <map>
#include <unordered_map>

#include "memory/backend.h"
#include "memory/bounce_pool.h"
#include "memory/copy_queues.h"
#include "transport/shm/ring.h"
#include "transport/shm/shm.h"

namespace dmx::shm {

class LinkImpl final : public ShmLink {
 public:
  LinkImpl(UnixChannel channel, const LinkOptions& options, const Layout& layout, char* base, int side);
  ~LinkImpl() override;

  UnixChannel& channel() { return channel_; }
  // The eventfd we sleep on and the peer's, which we ring.
  // Fails (kProtocol) when the peer's fd is not an eventfd.
  Status set_doorbells(UniqueFd mine, UniqueFd peers);

  Status post_send(MsgId id, MemRegion src) override;
  Status post_recv(MsgId id, MemRegion dst) override;
  Status post_send_list(MsgId id, std::vector<MemRegion> srcs) override;
  Status post_recv_list(MsgId id, std::vector<MemRegion> dsts) override;
  Status post_discard(MsgId id, size_t bytes) override;
  Status check_peer(std::vector<Completion>* out) override;
  size_t progress(std::vector<Completion>* out) override;
  Status wait(Deadline deadline) override;
  int wake_fd() const override { return my_bell_.get(); }
  int channel_fd() const override { return channel_.fd(); }
  bool arm_wakeup() override;
  void disarm_wakeup() override;
  size_t pending() const override { return sends_.size() + tx_chunks_.size() + recvs_.size() + failed_.size(); }
  const Status& error() const override { return error_; }
  LinkStats stats() const override { return stats_; }
  std::string peer_name() const override { return channel_.peer_name(); }
  const LinkOptions& options() const override { return options_; }
  void* debug_rx_ring_control() override { return rx_ctl_; }
  void* debug_rx_slot_header(uint32_t slot) override { return slot_header(1 - side_, slot); }

 private:
  // Lifecycle of a send: kQueued (in sends_, chunks being assigned to slots) -> all chunks
  // assigned (last chunk record in tx_chunks_ carries last=true) -> published -> completed.
  struct SendOp {
    MsgId id;
    MemRegion src;        // a list: its total size and kind (ptr unused)
    size_t assigned = 0;  // bytes given to slots so far
    // A list (post_send_list): the next byte comes from pieces[at] at off.
    std::vector<MemRegion> pieces{};
    size_t at = 0;
    size_t off = 0;
  };
  // Pinned bounce buffers (memory/bounce_pool.h) that a device copy of one chunk goes through.
  struct Bounce {
    BouncePool* pool = nullptr;
    std::vector<void*> pieces;  // BouncePool::kPiece bytes each, in order
  };
  // A slot filled (host) or being filled (device copy in flight) and not yet published. A device
  // chunk copies into its bounce buffers; once its fence completes they are copied into the slot
  // (`slot`), given back, and the slot is published.
  struct TxChunk {
    CopyQueue* queue;  // null: host copy, done
    uint64_t fence;
    MsgId id;
    size_t bytes;
    bool last;
    size_t msg_bytes;  // the message length (reported with the last chunk's completion)
    char* slot = nullptr;
    Bounce bounce;
  };
  // Lifecycle of a recv: kPosted (in recvs_) -> chunks arriving (received grows, device copies
  // outstanding) -> received == total and outstanding == 0 -> completed. Truncation fails it at the
  // first chunk; the rest of that message is discarded. A discard recv (post_discard) goes
  // through the same states and checks but copies nothing: dst.size is the exact length expected.
  struct RecvOp {
    MemRegion dst;
    bool discard = false;
    bool started = false;
    uint64_t total = 0;
    size_t received = 0;
    size_t outstanding = 0;  // device copies not finished
    // A list (post_recv_list): dst holds its total; the next byte goes to pieces[at] at off.
    std::vector<MemRegion> pieces{};
    size_t at = 0;
    size_t off = 0;
  };
  // A chunk copied out of its slot (released at once) into bounce buffers, on its way to device
  // memory: the buffers go back when the fence completes.
  struct RxCopy {
    CopyQueue* queue;
    uint64_t fence;
    MsgId id;  // the recv to credit
    Bounce bounce;
  };

  bool tx_step(std::vector<Completion>* out);
  bool rx_step(std::vector<Completion>* out);
  bool publish_ready(std::vector<Completion>* out);
  // Copies `len` bytes between a slot and user memory of kind `user`. Host memory: a memcpy
  // (returns a null queue). Device memory goes through pinned bounce buffers, never straight to or
  // from the slot (which would mean pinning the slots, and unpinning them later: bounce_pool.h):
  // into a slot, an asynchronous copy into them (returns the queue, the fence and the buffers;
  // the caller copies them into the slot once the fence completes, copy_from_bounce); out of a
  // slot, a host copy into them, then an asynchronous copy to the device (the slot is free on
  // return). `waiting`: the pool had no buffers; nothing was done, try again once copies finished.
  // to_slot: user -> slot; else slot -> user. bulk: host memory is written with non-temporal
  // stores (stream_copy; out of a slot only: the peer reads a slot next).
  struct SlotCopy {
    CopyQueue* queue = nullptr;
    uint64_t fence = 0;
    Bounce bounce;
    bool waiting = false;
  };
  Result<SlotCopy> copy_slot(void* dst, const void* src, size_t len, MemSpec user, bool to_slot, bool bulk);
  void host_copy(void* dst, const void* src, size_t len, bool bulk);
  void host_copy(std::span<const CopyCrew::Segment> segments, bool bulk);
  void copy_from_bounce(char* slot, const Bounce& b, size_t len);
  // A list's slot: gathers `len` bytes of host pieces into it.
  void gather(SendOp& op, char* slot, size_t len);
  // Scatters a slot's bytes [done, len) over a list recv's pieces; returns how far it got (less
  // than len when a device piece found the bounce pool empty: the rest on a later pass).
  Result<size_t> scatter(MsgId id, RecvOp& op, const char* slot, size_t len, size_t done, bool bulk);
  // Gives the buffers back to their pool once no copy uses them (`copies_over`); else keeps them
  // from the pool for good (a device that did not finish may still write them).
  void give_back(Bounce& b, bool copies_over);
  bool host_side(const MemRegion& r) const { return !r.where.is_device(); }
  char* slot_data(int ring, uint64_t count) const;
  SlotHeader* slot_header(int ring, uint64_t count) const;
  void ring_peer();
  void fail(Status status, std::vector<Completion>* out);
  void maybe_complete_recv(MsgId id, std::vector<Completion>* out);
  bool has_work();
  Status corrupt(std::string_view what);

  UnixChannel channel_;
  LinkOptions options_;
  Layout layout_;
  char* base_;
  int side_;  // 0 creator, 1 acceptor; we send on ring side_, receive on ring 1-side_
  RingControl* tx_ctl_;
  RingControl* rx_ctl_;
  Doorbells* bells_;
  UniqueFd my_bell_, peer_bell_;

  // Producer counters (ours; the peer's tail is read and validated into peer_tail_).
  uint64_t tx_head_ = 0, tx_reserved_ = 0, peer_tail_ = 0;
  // Consumer counters (ours; the peer's head is read and validated into peer_head_).
  uint64_t rx_tail_ = 0, rx_read_ = 0, peer_head_ = 0;
  size_t rx_slot_done_ = 0;  // bytes of slot rx_read_ a list recv has taken (scatter stopped midway)
  std::vector<CopyCrew::Segment> segments_;  // a list's host copies of one slot (gather, scatter)

  std::deque<SendOp> sends_;
  std::deque<TxChunk> tx_chunks_;
  std::unordered_map<MsgId, RecvOp> recvs_;
  std::deque<RxCopy> rx_copies_;
  std::map<MsgId, uint64_t> discarding_;  // truncated messages: bytes still to skip
  std::deque<Completion> failed_;         // completions owed after the link failed
  CopyQueues queues_;
  std::vector<Bounce> orphans_;  // buffers of copies that failed to queue: given back after a drain
  bool starved_ = false;  // a copy found the bounce pool empty: poll, do not sleep on the doorbell

  Status error_;
  bool peer_hup_ = false;
  uint32_t idle_rounds_ = 0;
  LinkStats stats_;
};

}  // namespace dmx::shm
