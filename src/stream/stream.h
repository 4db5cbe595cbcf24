// One stream of an endpoint. A worker (workers.h) runs it, among many others, one pass at a time.
//
// A pass moves frames both ways on its conduit (a TCP socket; for the control stream of two
// processes on one host, a shared-memory pipe), non-blocking:
//  - transmit: control frames first (pushed by anyone, thread-safe), then data chunks it pulls
//    from its host (the endpoint) whenever its pipeline has room — fast streams pull more, which
//    balances the load across streams. The frames ready at once (up to kMaxBatch) go out in one
//    writev: a request's control message and its payload, or an ACK and a reply, cost one system
//    call and wake the peer once. A chunk whose source is device memory is staged: the
//    stream copies it into a pinned slot on a copy engine (asynchronously; the copies of later
//    chunks overlap the socket write of earlier ones) and writes the slot once the copy is done.
//  - receive: it reads a header, asks the host where the payload goes (host memory: straight
//    into the destination; device memory: into a pinned slot, then an asynchronous copy to the
//    destination; or discarded), and tells the host when the payload has landed. Headers are read
//    through a 4 KiB read-ahead buffer, so a small frame costs one read (step_rx). An inline table
//    (RxPlan::prefix) comes in two steps: its entries, which the host turns into a scatter list,
//    then its pieces' bytes (host memory: in place, a recvmsg per batch of pieces).
// Liveness: it sends a keepalive when idle and fails when the peer is silent for too long, or when
// a frame it has begun does not finish within its budget (a trickling peer; check_frame_budget).
//
// Threading: every member without a comment is owned by the worker running the stream (one
// thread at a time: its worker, then the set's closer for finish()). push_control, wake and stop
// may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/sys.h"
#include "dmx/memory.h"
#include "memory/backend.h"
#include "memory/copy_queues.h"
#include "stream/conduit.h"
#include "stream/staging.h"
#include "stream/workers.h"
#include "wire/frame.h"

namespace dmx::stream {

// One run of bytes a frame's payload gathers (TxItem::pieces) or scatters (RxPlan::pieces).
struct Piece {
  void* at;
  size_t len;
  MemSpec where;  // RxPlan only (TxItem's are all of the item's `where`)
};

// A frame to transmit.
struct TxItem {
  wire::FrameHeader header;
  const void* src = nullptr;  // payload: user memory of kind `where`, or owned.data()
  MemSpec where;
  size_t len = 0;
  std::vector<unsigned char> owned;  // for small payloads copied at post time
  // An inline table chunk (docs/wire.md "Tables"): the payload is `owned` (the table), then these
  // runs of `where` in order; `len` counts both.
  std::vector<Piece> pieces;
  std::shared_ptr<void> ctx;         // the host's handle, given back in on_sent
  bool reply = false;                // a frame the peer's request caused (counted in reply_backlog)
  bool pulled = false;               // a data chunk the stream took with next_chunk
  // Stream-internal staging state.
  int slot = -1;
  uint64_t fence = 0;
  CopyQueue* queue = nullptr;
  uint64_t crc_ticket = 0;  // the device computes the source's CRC32C (StreamConfig::checksum)
};

// Transfers from this size are always bulk for RxPlan; from nt_receive_min (EngineParams) when
// another receive is in flight beside them (the endpoint decides: EndpointImpl::plan_into).
inline constexpr uint64_t kBulkTransfer = uint64_t{4} << 20;

// Where an arriving payload goes.
struct RxPlan {
  enum class Kind : uint8_t {
    kNone,     // no payload
    kHost,     // read straight into dst (host-accessible memory)
    kDevice,   // stage through a pinned slot, then copy to dst on `where`
    kControl,  // read into `control` (≤ wire::kMaxControlPayload)
    kDiscard,  // read and drop
  };
  Kind kind = Kind::kNone;
  void* dst = nullptr;
  MemSpec where;
  std::vector<unsigned char> control;
  std::shared_ptr<void> ctx;  // the host's handle, given back in on_landed
  int host_tag = 0;           // the host's own marker, given back in on_landed
  // kControl: only the payload's first `prefix` bytes (0: all) land in `control`; the host's
  // on_prefix then plans the rest (an inline table chunk: its table, then the pieces' bytes).
  uint32_t prefix = 0;
  // kHost, kDevice: the bytes scatter over these in order instead of landing at dst (kDevice:
  // through one slot, a copy per piece under one fence).
  std::vector<Piece> pieces;
  // kHost, a chunk of a large transfer (kBulkTransfer, nt_receive_min): read through a buffer
  // that stays in the worker's cache and stored into dst with non-temporal stores.
  bool bulk = false;
  // With StreamConfig::checksum, for a frame with wire::kFlagChecksum and its bytes inline (kHost,
  // kDevice, kControl): the CRC32C of the bytes as they landed, for the host to compare.
  bool crc_checked = false;
  uint32_t landed_crc = 0;
};

// What a stream needs from its endpoint. Called on the stream's worker (on_stream_stopped, and
// on_stream_failed of a stream that ended, on its set's closer), never while the stream holds a
// lock of its own. A worker runs other endpoints' streams too: a hook may wait only briefly.
class StreamHost {
 public:
  virtual ~StreamHost() = default;
  virtual Result<RxPlan> on_header(int stream, const wire::FrameHeader& h) = 0;
  // The payload is in place (for kDevice, after the copy to the device has finished).
  virtual Status on_landed(int stream, const wire::FrameHeader& h, RxPlan& plan) = 0;
  // A plan with a prefix: it has landed in `prefix`; where the rest of the payload goes.
  virtual Result<RxPlan> on_prefix(int stream, const wire::FrameHeader& h, const std::vector<unsigned char>& prefix);
  virtual bool next_chunk(int stream, TxItem* out) = 0;
  virtual void on_sent(int stream, TxItem& item) = 0;
  virtual void on_stream_failed(int stream, const Status& s) = 0;
  // The worker has exited; it holds no user memory and no pending copies any more.
  virtual void on_stream_stopped(int stream) = 0;
  // Stream 0 calls this on every pass (deadlines). Returns when it wants the next call at the
  // latest; an idle stream sleeps until then (or `tick` when sooner), so idle endpoints without
  // deadlines cost no wake-ups. A host whose next deadline moves earlier wakes the stream.
  virtual Clock::time_point on_tick() = 0;
  // Whether `stream` is the one that calls on_tick (the control stream; it may move). Any stream's
  // worker, on every pass; must be cheap.
  virtual bool ticks(int stream) { return stream == 0; }
  // Whether operations wait on the peer: the stream then holds it to busy_peer_timeout and probes
  // it when silent. Any stream's worker, on every pass; must be cheap.
  virtual bool awaiting() { return false; }
  // Asked before every read: true stops reading from the peer for now (back-pressure: the peer
  // does not read the replies its requests caused). Any stream's worker; must be cheap.
  virtual bool rx_paused() { return false; }
};

// A burst (the passes since the last one that moved no byte) that sent or received this many bytes
// of data chunks, whole, is bulk: the stream does not busy-poll after it. Control frames and eager
// messages never count, so small messages keep their spin however many are in flight.
inline constexpr uint64_t kBulkBurst = 32 << 10;

struct StreamConfig {
  int index = 0;
  size_t chunk_size = 1 << 20;
  int slots = 4;  // pipeline depth and staging slots per direction
  wire::Limits limits;
  std::chrono::microseconds keepalive{1'000'000};
  std::chrono::microseconds peer_timeout{10'000'000};
  // While the host is awaiting(): the silence that fails the stream (0: peer_timeout). Data of ours
  // the peer's host acknowledges counts as hearing from it (a slow link that drains our queue is
  // alive: looked at every eighth of it); past a quarter, a KEEPALIVE asks for an answer (a0 = 1).
  std::chrono::microseconds busy_peer_timeout{0};
  std::chrono::microseconds tick{10'000};  // the granularity of deadlines (they fire late by at most this)
  // After any progress the worker polls without sleeping for this long: a message that follows
  // within the window costs no wake-up (latency), at the price of a busy core meanwhile. Not after
  // bulk data (kBulkBurst).
  std::chrono::microseconds busy_poll{50};
  std::string peer;  // for messages
  // Stamp every inline data frame and EAGER with the CRC32C of its bytes (computed by the device
  // that holds them), and compute it over every such frame that lands (RxPlan::landed_crc).
  bool checksum = false;
  // GPU push (topo/push.h, docs/gpu-push.md): a staging copy of 1..max bytes is made by the
  // device's SMs (CopyQueue::push) instead of a copy engine, when they reach both ends. 0: never.
  uint64_t push_tx_max = 0;  // device -> pinned slot (posted writes over PCIe)
  uint64_t push_rx_max = 0;  // pinned slot -> device (the SMs read over PCIe)
};

struct StreamStats {
  uint64_t bytes_sent = 0, bytes_received = 0;  // payload bytes
  uint64_t frames_sent = 0, frames_received = 0;
  uint64_t d2h_copies = 0, d2h_bytes = 0, h2d_copies = 0, h2d_bytes = 0;
  uint64_t pushes = 0;  // of those copies, made by the SMs (GPU push)
  uint64_t lists = 0;   // of those copies, made as one list (CopyQueue::copy_list): inline tables
  uint64_t ns_send = 0, ns_recv = 0, ns_copy_wait = 0;
};

class Stream {
 public:
  // Bytes step_rx asks for when it reads a header: the header and, for small frames, the payload
  // behind it in one read (at most this much of a large payload is copied twice).
  static constexpr size_t kReadAhead = 4096;
  // The slowest a frame's payload may arrive, in bytes per second, once its first byte has: a frame
  // must be complete within peer_timeout + payload / kMinFrameRate (check_frame_budget). Low enough
  // for a 64 MiB chunk on one of 16 streams sharing a slow WAN link (256 s more).
  static constexpr uint64_t kMinFrameRate = 256 << 10;

  Stream(StreamConfig config, std::unique_ptr<Conduit> conduit, StreamHost* host, StagingPool* pool);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // What a worker's pass (turn) found: turn again soon, park until wake_by() or an event on
  // sleep_fds(), or done (the stream ended: finish() it off the worker).
  enum class Turn { kAgain, kSleep, kDone };
  Turn turn();
  Clock::time_point wake_by() const { return wake_by_; }
  // `t` moved up to the idle-timer grid (stream.cc).
  Clock::time_point coalesce(Clock::time_point t, Clock::time_point now) const;
  // After kSleep: fills at most 3 pollfds to wait on and returns how many; -1 when something
  // arrived meanwhile (turn again).
  int sleep_fds(pollfd* fds);
  // The worker took it out of its sleep (an event, the deadline, a wake-up).
  void woke();
  // After kDone, off the worker: reports the failure, waits for copies in flight, and tells the
  // host the stream stopped.
  void finish();

  void push_control(TxItem item);  // any thread
  // Any thread: bytes of reply frames (TxItem::reply) queued and not yet written.
  uint64_t reply_backlog() const { return reply_bytes_.load(std::memory_order_relaxed); }
  void wake();                     // any thread: chunks may be available
  // Any thread: the worker stops at once; the conduit is shut down so the peer learns now.
  void stop();
  StreamStats stats() const;
  int index() const { return config_.index; }
  const char* conduit_kind() const { return conduit_->kind(); }
  // Worker thread only (e.g. in StreamHost::on_landed): whether more frames may be waiting behind
  // the one being handled — bytes of them are read ahead already, or the last read filled its
  // buffer (a short read means the conduit had nothing more).
  bool rx_backlog() const { return ahead_pos_ < ahead_len_ || !last_read_short_; }

 private:
  struct PendingRx {  // a payload in a slot, on its way to the device
    wire::FrameHeader header;
    RxPlan plan;
    int slot;
    uint64_t fence;
    CopyQueue* queue;
    uint64_t crc_ticket;  // nonzero: the device's CRC of the landed bytes
  };
  enum class Io { kProgress, kIdle, kBlocked };

  friend class Worker;
  friend class Closer;
  friend class Workers;
  Status step_tx(Io* io);
  Status step_rx(Io* io);
  Status fill_pipeline(bool* progress);
  Status reap_rx(bool block, bool* progress);
  Status begin_payload();
  Status begin_rest();
  Status take_rx_slot(size_t len);
  Status finish_payload();
  Status scatter_from_slot(CopyQueue* q, uint64_t* fence);
  Result<CopyQueue*> queue_for(MemSpec where);
  Status ensure_slots();
  void drain();
  bool take_next();
  void frame_sent(TxItem& item);
  Status stage_control(TxItem& item);
  // A staging copy: by the SMs when `n` is at most `push_max` and they reach both ends, else by
  // the copy engine (`to_host` picks the direction).
  Status staging_copy(CopyQueue* q, void* dst, const void* src, size_t n, uint64_t push_max, bool to_host);
  // An inline table's device pieces (spans_) on q: as one list when the queue can, else each by
  // staging_copy.
  Status staging_copy_list(CopyQueue* q, bool to_host);
  // Sets the header's checksum of an inline data frame or EAGER (StreamConfig::checksum).
  void stamp(TxItem& item) const;
  bool checks(const wire::FrameHeader& h) const {
    return config_.checksum && h.path == 0 && wire::carries_data(h.type);
  }
  Status check_frame_budget(Clock::time_point now) const;
  static uint64_t ns_since(Clock::time_point t);
  // The silence that fails the stream now, and whether operations wait (awaiting()).
  std::chrono::microseconds silence_limit(bool busy) const;
  void push_keepalive(bool probe);

  const StreamConfig config_;
  const std::unique_ptr<Conduit> conduit_;
  StreamHost* host_;
  StagingPool* pool_;
  WorkerSlot slot_;

  std::mutex mu_;  // guards control_
  std::deque<TxItem> control_;
  std::atomic<bool> has_control_{false};  // == !control_.empty(), written under mu_
  std::atomic<uint64_t> reply_bytes_{0};   // queued reply frames' bytes (header and payload)
  std::atomic<bool> stop_{false};
  std::atomic<bool> sleeping_{false};  // the stream may be parked: wake() must tell its worker

  // The pass's state between turns.
  Status failure_;
  Clock::time_point last_progress_, prev_, wake_by_;
  uint64_t burst_bytes_ = 0;  // bytes read and written since the last pass that moved none
  uint64_t burst_data_ = 0;   // of which data chunks' payloads, counted once a chunk is whole
  bool spin_ = true;          // the last burst was not bulk: busy-poll after it
  bool armed_ = false;        // sleeping_ is set
  bool want_room_ = false;    // the last write found no room
  bool paused_ = false;       // the host paused reading

  // Transmit.
  struct OutFrame {
    TxItem item;
    wire::HeaderBytes header;
    bool chunk;  // pulled from chunks_ (counts against the pipeline)
  };
  static constexpr size_t kMaxBatch = 8;  // frames per writev
  static constexpr size_t kMaxIov = 1024;  // IOV_MAX
  // An inline table's pieces per system call, at most (step_tx, step_rx).
  static constexpr size_t kScatterIov = 256, kScatterBytes = 256 << 10;
  std::deque<TxItem> chunks_;  // pulled data chunks, in order; staged ones carry fences
  std::deque<OutFrame> out_;   // frames being written, in order; the front may be partly out
  std::vector<iovec> iov_;     // step_tx's, kept for its capacity
  size_t out_written_ = 0;     // bytes of out_.front() written
  size_t out_chunks_ = 0;      // frames in out_ with chunk set
#if defined(DMX_TRACE_ENABLED)
  Clock::time_point trace_stall_{};  // since when nothing was ready to write but a chunk's D2H copy
#endif
  Status control_error_;  // staging of an inline device payload failed
  bool push_refusal_logged_ = false;  // staging_copy said once why a copy was not pushed
  bool list_refusal_logged_ = false;  // staging_copy_list said once why a list went span by span
  std::vector<CopyQueue::Span> spans_;  // staging_copy_list's, kept for their capacity
  Clock::time_point last_tx_;

  // Receive.
  // The read-ahead of step_rx and its unconsumed bytes [ahead_pos_, ahead_len_).
  std::vector<unsigned char> rx_ahead_ = std::vector<unsigned char>(kReadAhead);
  size_t ahead_pos_ = 0, ahead_len_ = 0;
  bool last_read_short_ = true;  // the last read returned less than it asked for (rx_backlog)
  unsigned char rx_header_[wire::kHeaderSize];
  size_t rx_header_got_ = 0;
  bool in_payload_ = false;
  wire::FrameHeader rx_;
  RxPlan rx_plan_;
  size_t rx_payload_got_ = 0;
  size_t rx_plan_at_ = 0;  // where in the payload rx_plan_ begins (after a prefix)
  size_t rx_piece_ = 0, rx_piece_got_ = 0;  // the piece being filled (RxPlan::pieces)
  std::vector<iovec> rx_iov_;                // the pieces step_rx reads into at once
  int rx_slot_ = -1;
  std::vector<unsigned char> scratch_;
  std::deque<PendingRx> pending_rx_;
  Clock::time_point last_rx_;
  Clock::time_point last_probe_;  // the last look at a silent peer (acked_bytes, or a probe)
  uint64_t acked_seen_ = 0;       // the conduit's acked_bytes() when last looked at
  Clock::time_point rx_frame_start_;  // the first byte of the frame in progress arrived


  // Staging.
  CopyQueues queues_;
  StagingSlots slots_;
  std::vector<int> free_tx_slots_, free_rx_slots_;

  // Statistics (written by the worker, read by anyone).
  struct AtomicStats {
    std::atomic<uint64_t> bytes_sent{0}, bytes_received{0}, frames_sent{0}, frames_received{0};
    std::atomic<uint64_t> d2h_copies{0}, d2h_bytes{0}, h2d_copies{0}, h2d_bytes{0}, pushes{0}, lists{0};
    std::atomic<uint64_t> ns_send{0}, ns_recv{0}, ns_copy_wait{0};
  } stats_;
};

}  // namespace dmx::stream
