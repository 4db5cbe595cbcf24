// ShmLink's implementation (private to src/transport/shm).
#pragma once

#include <deque>
#include <map>
#include <unordered_map>

#include "memory/backend.h"
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
    MemRegion src;
    size_t assigned = 0;  // bytes given to slots so far
  };
  // A slot filled (host) or being filled (device copy in flight) and not yet published.
  struct TxChunk {
    CopyQueue* queue;  // null: host copy, done
    uint64_t fence;
    MsgId id;
    size_t bytes;
    bool last;
    size_t msg_bytes;  // the message length (reported with the last chunk's completion)
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
  };
  // A slot consumed and not yet released (device copy out of it in flight).
  struct RxChunk {
    CopyQueue* queue;
    uint64_t fence;
    MsgId id;  // the recv to credit; kNoOp when the chunk was discarded
    bool discard;
  };

  bool tx_step(std::vector<Completion>* out);
  bool rx_step(std::vector<Completion>* out);
  bool publish_ready(std::vector<Completion>* out);
  Result<CopyQueue*> queue_for(MemSpec where);
  // Copies `len` bytes between a slot and user memory of kind `user`: a memcpy for host memory
  // (returns a null queue), else an asynchronous copy on the device's queue (returns it and the
  // fence to wait for). to_slot: user -> slot; else slot -> user. bulk: host memory is written
  // with non-temporal stores (stream_copy; out of a slot only: the peer reads a slot next).
  struct SlotCopy {
    CopyQueue* queue = nullptr;
    uint64_t fence = 0;
  };
  Result<SlotCopy> copy_slot(void* dst, const void* src, size_t len, MemSpec user, bool to_slot, bool bulk);
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

  std::deque<SendOp> sends_;
  std::deque<TxChunk> tx_chunks_;
  std::unordered_map<MsgId, RecvOp> recvs_;
  std::deque<RxChunk> rx_chunks_;
  std::map<MsgId, uint64_t> discarding_;  // truncated messages: bytes still to skip
  std::deque<Completion> failed_;         // completions owed after the link failed
  CopyQueues queues_;
  MemoryBackend* pinned_by_ = nullptr;  // whose pin_host pinned our mapping (undone before munmap)
  bool pin_failed_ = false;             // said once; device copies then go through pageable memory

  Status error_;
  bool peer_hup_ = false;
  uint32_t idle_rounds_ = 0;
  LinkStats stats_;
};

}  // namespace dmx::shm
