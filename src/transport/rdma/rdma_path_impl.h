// The rdma path's class (rdma_path.h), private to its two files: rdma_path.cc has the PathBase
// hooks, the completions and the WRITE path (windows, clear-to-sends answered by WRITEs with
// immediate data); rdma_slots.cc has the SEND slots (small chunks and their credits, clear-to-sends
// and `done`s going out, the send queues). Nothing else includes it.
#pragma once

#include <arpa/inet.h>

#include <array>
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/clock.h"
#include "memory/copy_queues.h"
#include "transport/path_base.h"
#include "transport/rdma/rdma_path.h"

namespace dmx::rdma::path_impl {

constexpr auto kSpin = std::chrono::microseconds(50);
constexpr auto kIdleSleep = std::chrono::milliseconds(100);  // bound on one sleep (the socket is watched too)
constexpr auto kDrain = std::chrono::seconds(5);             // flushed work after to_error(), at the end
constexpr uint64_t kMinStripe = 64 << 10;                    // stripes of a chunk over the queue pairs
constexpr int kPollBatch = 32;
constexpr int kPostBatch = 32;  // work requests chained into one ibv_post_send
constexpr size_t kSpares = 2;               // staging buffers kept for reuse,
constexpr uint64_t kSpareMax = 16 << 20;    // each at most this large
// A list's sources the user did not register are registered as one span up to this size.
constexpr uint64_t kListSpanMax = 64 << 20;
constexpr auto kCopyWait = std::chrono::seconds(10);  // a staged chunk's device copies
// Bytes of staging a receiver holds for chunks in flight (at least one chunk, however large).
constexpr uint64_t kMaxStaged = 64 << 20;
// A region's registration serves as the local side only (the source of a WRITE, the landing of a
// small chunk's copy): it never grants the peer anything.
constexpr int kRegionAccess = IBV_ACCESS_LOCAL_WRITE;
constexpr uint32_t kNoSlot = 0xFFFF;

// wr_id of sends: the kind in the top byte, a send slot (kNoSlot: none) in bits 32-47, the token
// below. Receives carry their queue pair << 32 | their slot (kind 0).
constexpr uint64_t kWrWrite = uint64_t{1} << 56, kWrSend = uint64_t{2} << 56, kWrKind = uint64_t{0xff} << 56;
inline uint64_t send_id(uint64_t kind, uint32_t slot, uint32_t token) {
  return kind | uint64_t{slot} << 32 | token;
}
inline uint32_t id_slot(uint64_t wr_id) {
  return static_cast<uint32_t>(wr_id >> 32) & 0xFFFF;
}
inline uint32_t id_token(uint64_t wr_id) {
  return static_cast<uint32_t>(wr_id) & kMaxToken;
}

// SEND with immediate data (wire.h's QpMessage).
inline uint32_t imm(QpMessage kind, uint32_t token) {
  return htonl(kind << 24 | token);
}

// By the wr_id: a completion with an error status has no valid opcode.
inline const char* wr_text(uint64_t wr_id) {
  switch (wr_id & kWrKind) {
    case kWrWrite:
      return "RDMA WRITE";
    case kWrSend:
      return "SEND";
    case 0:
      return "receive";
    default:
      return "work request";
  }
}

inline bool host_kind(const MemSpec& m) {
  return m.kind == MemKind::kHost || m.kind == MemKind::kPinned;
}

// The state of one chunk on each side (the lifecycle beside each):
//   sender, large:  registered -> (clear-to-send) -> WRITEs posted -> every WRITE completed: tx done
//   sender, small:  queued -> a credit and a send slot: copied and SENT: tx done; the credit is back at kMsgDone
//   receiver, large: queued -> (staged: room for its staging, in order) -> window registered,
//                    clear-to-send SENT -> every stripe's immediate: rx done (staged: copied out first)
//   receiver, small: the header (post_rx) and the SEND meet in either order -> copied, slot reposted, kMsgDone: rx done
class RdmaPath final : public PathBase {
  struct TxChunk {
    uint64_t seq;
    MemRegion src;  // a list's: its first piece's address and kind, and the pieces' total length
    bool small;
    std::vector<ibv_sge> from{};               // a large chunk's source: one piece, or a list's, each with its lkey
    std::vector<std::shared_ptr<Mr>> owned{};  // registrations of this chunk alone (none: its regions')
    size_t wrs_left = 0;                       // WRITEs posted and not yet completed
  };
  struct RxJob {
    uint64_t seq;
    ChunkDescriptor d;
    MemRegion dst;                    // a list's: its first piece's address and kind, the total length
    std::vector<MemRegion> pieces{};  // a list's destinations (post_rx_list); empty for one chunk
  };
  struct RxOp {  // a large chunk being written
    uint64_t seq;
    uint64_t len;
    int stripes_left;
    std::shared_ptr<Mr> window;     // exactly where the peer may write, for exactly this chunk
    std::optional<Buffer> staging;  // memory the NIC cannot reach, and every list, lands here first
    MemRegion dst;                  // then is copied here
    std::vector<MemRegion> pieces;  // or scattered into these (a list)
  };
  struct Held {  // a small chunk in its receive slot, waiting for its header
    int qp;
    uint32_t slot;
    uint32_t len;
  };
  struct Wr {
    uint64_t id;
    ibv_wr_opcode opcode;
    uint64_t remote_addr = 0;
    uint32_t rkey = 0;
    uint32_t imm = 0;
    int nsge = 0;
    std::array<ibv_sge, kMaxSendSge> sge{};
  };
  // A SEND with immediate data and at most one piece (an empty `sge`: no bytes).
  static Wr send_wr(uint64_t id, ibv_sge sge, uint32_t imm) {
    Wr w{id, IBV_WR_SEND_WITH_IMM, 0, 0, imm, sge.length > 0 ? 1 : 0};
    w.sge[0] = sge;
    return w;
  }

 public:
  explicit RdmaPath(PathSetup s)
      : PathBase({.thread_name = "dmx-rdma",
                  .spin = kSpin,
                  .stopped = Status(Code::kClosed, "the rdma path is stopped").with_peer(s.peer)}),
        device_(std::move(s.device)),
        regions_(std::move(s.regions)),
        gpu_(std::move(s.gpu)),
        conn_(std::move(s.connection)),
        socket_(std::move(s.socket)),
        peer_(std::move(s.peer)),
        tamper_(s.tamper),
        max_chunk_(std::min(conn_->mine.max_chunk, conn_->theirs.max_chunk)),
        sq_inflight_(conn_->qps.size(), 0),
        sq_waiting_(conn_->qps.size()),
        credits_(conn_->qps.size(), conn_->theirs.credits),
        held_per_qp_(conn_->qps.size(), 0) {
    for (uint32_t i = 0; i < conn_->send_slots; ++i) free_slots_.push_back(i);
  }

  ~RdmaPath() override {
    end_thread();
    forget_regions();
  }

  std::string_view name() const override { return "rdma"; }
  bool carries(const MemSpec& m) const override { return host_kind(m) || gpu_.direct(m); }
  // Every destination: memory the NIC cannot register (GPU memory without dma-buf or peer memory,
  // or the advisor's staging) lands in a host buffer first and is copied by the copy engines.
  bool accepts(const MemSpec&) const override { return true; }
  bool accepts_any() const override { return true; }
  uint64_t max_chunk() const override { return max_chunk_; }
  bool receiver_releases() const override { return false; }
  size_t max_list() const override { return kRdmaMaxList; }

  Result<std::vector<unsigned char>> post_tx(uint64_t seq, const MemRegion& src, bool) override;
  Result<uint64_t> chunk_length(std::span<const unsigned char> descriptor) override;
  Status post_rx(uint64_t seq, std::span<const unsigned char> descriptor, const MemRegion& dst) override;
  Result<std::vector<unsigned char>> post_tx_list(uint64_t seq, std::span<const MemRegion> srcs,
                                                  size_t* taken) override;
  Status post_rx_list(uint64_t seq, std::span<const unsigned char> descriptor,
                      std::span<const MemRegion> dsts) override;
  std::string describe() const override;

 private:
  // The registration of [r.ptr, +r.size): its registered region's when the user registered one and
  // `access` asks nothing remote, else one made for it alone (returned in `owned` too).
  Result<std::shared_ptr<Mr>> registration(const MemRegion& r, int access, std::shared_ptr<Mr>* owned);
  void remember(const std::shared_ptr<RegisteredRegion>& reg);
  // Takes a token for `c` and queues it (a small chunk for its SEND); the chunk's descriptor.
  Result<std::vector<unsigned char>> add_tx(TxChunk c);
  void forget_regions();

  // ---- the progress thread ----
  bool progress(std::vector<Done>* done) override;
  // `admitted`: a staged chunk let through by admit_staged (it waits no more).
  void start_rx(const RxJob& j, std::vector<Done>* done, bool admitted = false);
  // Whether a chunk of `len` bytes may be staged now (kMaxStaged; one chunk always may).
  bool staging_room(uint64_t len) const;
  // Starts the staged chunks that waited for room, in order.
  void admit_staged(std::vector<Done>* done);

  // How many stripes a chunk of `len` bytes is cut into, each ending in one WRITE with immediate
  // data (both sides count alike).
  int stripes(uint64_t len) const { return static_cast<int>((len + stripe_size(len) - 1) / stripe_size(len)); }
  uint64_t stripe_size(uint64_t len) const {
    const uint64_t nqp = conn_->qps.size();
    return std::max(kMinStripe, (len + nqp - 1) / nqp);
  }

  // A small chunk's bytes met its header: into the destination, the slot back to the NIC, and the
  // credit back to the sender.
  void land_small(const RxJob& j, const Held& h, std::vector<Done>* done);

  // Small chunks waiting for a credit and a send slot, in order.
  bool send_small(std::vector<Done>* done);

  // The receiver's clear-to-send (or drop) for `token`, in a send slot.
  void cts(uint32_t token, const Cts& c);
  void queue_wr(int qp, const Wr& w);
  bool flush_waiting();
  bool flush_qp(int qp);
  void repost(int qp, uint32_t slot);
  void protocol(std::string what) { fail_with(Status(Code::kProtocol, "rdma: " + what).with_peer(peer_)); }

  void on_completion(const ibv_wc& wc, std::vector<Done>* done);
  // rdma_slots.cc: a small chunk's header, and a SEND of the peer's.
  void start_small_rx(const RxJob& j, std::vector<Done>* done);
  void on_message(int qp, uint32_t slot, uint32_t byte_len, uint32_t word, std::vector<Done>* done);

  // The sender: the receiver's clear-to-send for a large chunk.
  void on_cts(uint32_t token, std::span<const unsigned char> body, std::vector<Done>* done);
  // The WRITEs of a large chunk of `len` bytes from `from` into the receiver's window at `remote`:
  // each of its stripes(len) stripes on its queue pair, the stripe's WRITEs gathering up to send_sge
  // pieces and its last carrying the token as immediate data (RC: the stripe is whole when it lands).
  std::vector<std::pair<int, Wr>> plan_writes(uint32_t token, const std::vector<ibv_sge>& from, uint64_t len,
                                              uint64_t remote, uint32_t rkey) const;
  void post_writes();
  // A host buffer for a landing of `len` bytes (reused: a list's staging window).
  Result<Buffer> staging(uint64_t len);
  // A staged chunk's bytes, `from` its staging buffer, into its pieces (in order).
  Status scatter(std::span<const MemRegion> pieces, const unsigned char* from);

  // The receiver: one stripe of a large chunk is in place.
  void on_written(uint32_t word, std::vector<Done>* done);
  void fail_with(Status s);
  bool idle() override;
  void release(const Status& why, std::vector<Done>* done) override;

  const std::shared_ptr<Device> device_;
  const std::shared_ptr<RegionTable> regions_;
  const GpuRegistration gpu_;
  const std::unique_ptr<Connection> conn_;
  const UniqueFd socket_;
  const std::string peer_;
  const WriteTamper* const tamper_;
  const uint64_t max_chunk_;

  std::mutex tx_mu_;  // guards tx_, next_token_
  std::unordered_map<uint32_t, TxChunk> tx_;
  uint32_t next_token_ = 1;

  std::mutex used_mu_;  // guards used_: the registered regions this path made Mrs for
  std::map<const RegisteredRegion*, std::weak_ptr<RegisteredRegion>> used_;

  std::deque<RxJob> jobs_;         // under the post lock
  std::deque<uint32_t> small_tx_;  // under the post lock: small chunks posted (their tokens)

  // The progress thread's own.
  std::unordered_map<uint32_t, RxOp> rx_;             // large chunks being written, by token
  std::unordered_map<uint32_t, RxJob> small_rx_;      // small chunks whose header came first
  std::unordered_map<uint32_t, Held> held_;           // small chunks whose bytes came first (in their slots)
  std::unordered_map<uint32_t, int> small_inflight_;  // sent small chunks awaiting kMsgDone: their queue pair
  std::deque<uint32_t> small_waiting_;                // small chunks waiting for a credit or a slot
  std::deque<std::pair<uint32_t, Cts>> cts_waiting_;
  std::vector<std::pair<int, Wr>> pending_writes_;  // WRITEs for their queue pairs (a test may hold them)
  std::vector<Buffer> spare_;                       // staging buffers to reuse (at most kSpares)
  std::deque<RxJob> staged_waiting_;                // chunks to stage, waiting for room
  uint64_t staged_bytes_ = 0;                       // staging held by chunks in rx_
  std::vector<Buffer> orphans_;  // staging a failed scatter's copies may still read: freed at the end
  CopyQueues queues_;            // device pieces' copies (destroyed first: their copies end before the buffers go)
  std::vector<int> sq_inflight_;
  std::vector<std::deque<Wr>> sq_waiting_;
  std::vector<int> credits_;      // small chunks we may still send per queue pair
  std::vector<int> held_per_qp_;  // the peer's small chunks in our slots per queue pair
  std::deque<uint32_t> free_slots_;
  size_t next_small_qp_ = 0;
  std::vector<ibv_wc> stash_;

  std::atomic<uint64_t> per_chunk_{0}, by_region_{0};
};

}  // namespace dmx::rdma::path_impl
