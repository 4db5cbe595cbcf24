// The shared state behind an Endpoint: matching, one-sided targets, completion order, failure.
//
// Threads: user threads post operations; each stream's worker calls the StreamHost hooks; each
// payload path's thread calls on_path_* (through its PathEvents).
// mu_ guards everything below it. Lock order: mu_ -> a Stream's queue lock -> an OpState's mu.
// Completion callbacks run with no lock held (deliver()).
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/log.h"
#include "dmx/endpoint.h"
#include "engine/context_impl.h"
#include "engine/metrics.h"
#include "engine/op.h"
#include "engine/ranking.h"
#include "engine/transports.h"
#include "stream/stream.h"
#include "transport/path.h"
#include "transport/striping.h"
#include "wire/handshake.h"

namespace dmx {

namespace endpoint {
struct VecBuild;
}

// A broken connection in the one form every transport reports: kPeerFailed, "lost the peer: ...".
// Violations and local faults keep their own code.
Status as_lost_peer(const Status& s);

// What both sides agreed in the handshake.
struct Session {
  uint16_t streams = 1;  // stream sockets: the data streams and, beside more than one, the control stream
  uint32_t chunk_size = 1 << 20;
  uint32_t peer_eager_limit = 0;        // largest EAGER we may send
  uint64_t peer_unexpected_budget = 0;  // EAGER bytes the peer buffers for us
  std::string peer;                     // "10.0.0.2:7000"
  std::string peer_key;                 // the listener's max_endpoints_per_peer key; empty: not counted
  std::string transport;                // the agreed payload transports, "+"-joined, or tcp
  TransportList agreed;                 // path id k is agreed[k - 1]
  // The order this side's sender tries them in, per memory kind (engine/ranking.h); null: id order.
  std::shared_ptr<const TransportRanking> ranking;
  std::chrono::microseconds keepalive{1'000'000};  // often enough for the peer's timeout
  std::string reason;
  bool checksum = false;  // every data chunk carries its CRC32C (either side asked)
  // Data streams acknowledge their chunks on stream 0 (LINK_ACK), and a dead one's unacknowledged
  // chunks move to the others (LINK_DOWN): wire::multilink_agreed, with more than one stream.
  bool multilink = false;
  std::vector<std::string> routes;  // per stream: "local -> remote" of its socket (empty: unknown)
  std::string peer_name;  // the peer's name and epoch in the store (its HELLO); "" and 0: none
  uint64_t peer_epoch = 0;
  // Reconnect (endpoint/reconnect.cc): what a REJOIN is bound to, and where the client dials.
  uint64_t session_id = 0;
  wire::Nonce client_nonce{}, server_nonce{};
  uint64_t my_epoch = 0;             // this side's epoch when the session began (0: no store)
  bool is_client = false;            // this side connected: it dials again
  std::vector<std::string> redial;  // client: the peer's addresses, "host:port", the first the one it reached
};

// An endpoint's streams: room for every stream it may ever have (reconnects add some) made once,
// appended to under the endpoint's mu_, read by anyone without a lock.
class StreamTable {
 public:
  using Ptr = std::unique_ptr<stream::Stream>;
  void reserve(size_t n) { slots_.resize(n); }
  size_t capacity() const { return slots_.size(); }
  size_t size() const { return size_.load(std::memory_order_acquire); }
  bool empty() const { return size() == 0; }
  const Ptr& operator[](size_t i) const { return slots_[i]; }
  const Ptr* begin() const { return slots_.data(); }
  const Ptr* end() const { return slots_.data() + size(); }
  void push_back(Ptr s) {
    size_t n = size_.load(std::memory_order_relaxed);
    slots_[n] = std::move(s);
    size_.store(n + 1, std::memory_order_release);
  }

 private:
  std::vector<Ptr> slots_;
  std::atomic<size_t> size_{0};
};

struct DeviceLink;  // endpoint/device.cc

class EndpointImpl final : public stream::StreamHost,
                           public RegistrationUser,
                           public EvictableEndpoint,
                           public std::enable_shared_from_this<EndpointImpl> {
 public:
  // One stream per conduit (stream 0 first: the control stream). `paths[k - 1]`: path id k, or
  // null for an agreed transport that made none.
  static std::shared_ptr<EndpointImpl> create(std::shared_ptr<ContextImpl> ctx, Session session,
                                              std::vector<std::unique_ptr<stream::Conduit>> conduits,
                                              std::vector<std::unique_ptr<PayloadPath>> paths = {});
  ~EndpointImpl() override;

  Request post_send(const MemRegion& src, uint64_t tag, OpOptions o);
  Request post_recv(const MemRegion& dst, uint64_t tag, OpOptions o);
  Request post_write(const MemRegion& src, const RemoteRegion& dst, uint64_t offset, OpOptions o);
  Request post_read(const MemRegion& dst, const RemoteRegion& src, uint64_t offset, OpOptions o);
  Request post_write_vec(std::span<const MemRegion> local, std::span<const RemoteRegion> remote,
                         std::span<const IoEntry> entries, OpOptions o);
  Request post_read_vec(std::span<const MemRegion> local, std::span<const RemoteRegion> remote,
                        std::span<const IoEntry> entries, OpOptions o);
  Request post_send_vec(std::span<const MemRegion> regions, std::span<const IoPiece> pieces, uint64_t tag,
                        OpOptions o);
  Request post_recv_vec(std::span<const MemRegion> regions, std::span<const IoPiece> pieces, uint64_t tag,
                        OpOptions o);
  void cancel(const std::shared_ptr<OpState>& op, Status why);
  Result<Notification> next_notification(Duration timeout);
  void set_note_handler(std::function<void(const Notification&)> handler);
  EndpointStats stats() const;
  Status health() const;
  Result<DeviceHandle> device_handle(const DeviceHandleOptions& options);  // endpoint/device.cc
  Result<std::vector<unsigned char>> export_device_window(const MemRegion& region);  // endpoint/device.cc
  Result<DeviceWindow> import_device_window(std::span<const unsigned char> bytes);  // endpoint/device.cc
  void device_stats(EndpointStats* s) const;                                         // endpoint/device.cc
  const std::string& peer() const { return session_.peer; }
  const Session& session() const { return session_; }
  Status close();

  // stream::StreamHost
  Result<stream::RxPlan> on_header(int stream, const wire::FrameHeader& h) override;
  Status on_landed(int stream, const wire::FrameHeader& h, stream::RxPlan& plan) override;
  Result<stream::RxPlan> on_prefix(int stream, const wire::FrameHeader& h,
                                   const std::vector<unsigned char>& table) override;
  bool next_chunk(int stream, stream::TxItem* out) override;
  void on_sent(int stream, stream::TxItem& item) override;
  void on_stream_failed(int stream, const Status& s) override;
  void on_stream_stopped(int stream) override;
  Clock::time_point on_tick() override;
  bool ticks(int stream) override { return stream == ctl_stream_.load(std::memory_order_relaxed); }
  bool rx_paused() override;
  bool awaiting() override { return awaiting_.load(std::memory_order_relaxed); }

  // A path's events (PathEvents, endpoint/paths.cc), with the path's id.
  void on_path_tx_done(uint8_t path, uint64_t seq, const Status& s);
  void on_path_rx_done(uint8_t path, uint64_t seq, const Status& s);
  void on_path_failed(uint8_t path, const Status& s);
  void on_path_stopped(uint8_t path);
  std::unique_ptr<PayloadPath::Events> events_for(uint8_t id);

  // RegistrationUser
  void withdraw(Registered& reg) override;
  void abandon(const Status& why) override { fail(why.with_peer(session_.peer)); }

  // Reconnect (endpoint/reconnect.cc). The listener: whether a REJOIN for stream `index` fits this
  // endpoint (alive, reconnect on, the next index, room left); the reason when not.
  Status rejoin_fits(uint16_t first, uint16_t index);
  // Both sides: a rejoined stream (its handshake done) joins as stream `index`, a new link; the
  // streams below `first` (its round's first) are replaced: the client rejoins only once all of
  // its own are gone.
  Status add_stream(uint16_t first, uint16_t index, UniqueFd fd);

  // EvictableEndpoint: the peer gets a CLOSE with `why`; the streams stop when it answers, or
  // kEvictedCloseWait later.
  bool evict_if_idle(const Status& why) override;

 private:
  // A payload path and its chunks in flight (endpoint/paths.cc). Sequence numbers count the
  // path's chunk headers on stream 0, per direction.
  struct PathState {
    std::unique_ptr<PayloadPath> path;
    std::unique_ptr<PayloadPath::Events> events;  // tells the endpoint this path's id
    uint8_t id = 0;
    uint64_t tx_seq = 0, rx_seq = 0;
    struct Tx {
      std::shared_ptr<OpState> op;
      uint64_t len = 0;
    };
    struct Rx {
      wire::FrameHeader header;
      uint64_t len = 0;
      // The plan's marker and handle: for a transfer's chunk, host_tag != 0 when an op's inflight
      // was raised for it; for an EAGER, where the message lands (plan_eager).
      int host_tag = 0;
      std::shared_ptr<void> ctx;
      MemRegion dst;  // where the path puts the bytes (null: dropped); checked with checksums
    };
    std::unordered_map<uint64_t, Tx> tx;
    std::unordered_map<uint64_t, Rx> rx;
  };
  // A chunk of a vectored recv that spans its pieces: it lands here, then is scattered (scatter).
  struct Bounce {
    std::shared_ptr<OpState> op;
    uint64_t at = 0;
    std::vector<unsigned char> bytes;
  };
  // Scatters a landed Bounce (an RxPlan's ctx) over its op's pieces. Caller holds mu_.
  static Status scatter(const std::shared_ptr<void>& bounce);
  // An outgoing data transfer, chunked by whichever streams pull it.
  struct Transfer {
    std::shared_ptr<OpState> op;
    wire::FrameType type;
    const char* src;
    MemSpec where;
    uint64_t next = 0;
    bool emitted = false;  // a zero-byte transfer still sends one (empty) chunk
    uint64_t accepts = 0;     // path bits the peer's buffer accepts (CTS a1, READ_REQ a3)
    uint32_t skip_paths = 0;  // path bits of paths that cannot carry this source (kUnavailable)
    size_t seg = 0;           // vectored: the segment holding byte `next`
  };
  // Bytes arriving for a matched recv (keyed by token) or a read (keyed by op id). Outlives its
  // op when the op stops early: later chunks are then read and dropped until `expected`.
  struct Inbound {
    std::shared_ptr<OpState> op;  // null once the op has finished
    uint64_t msg = 0;
    uint64_t total = 0, received = 0, expected = 0;
    uint64_t reserved = 0;  // bytes of chunks whose headers arrived (≥ received)
  };
  // A message that arrived before a matching recv.
  struct Unexpected {
    uint64_t msg = 0, tag = 0, size = 0;
    bool eager = false, landed = false;
    std::vector<unsigned char> data;
    std::shared_ptr<OpState> waiting;  // a recv that claimed it before its payload landed
    uint32_t via = 0;                  // OpState::via of the path that brought it
    uint32_t crc = 0;                  // with checksums: the message's CRC32C
    Status corrupt;                    // its bytes failed their checksum: the recv fails with it
    MemoryBudget::Charge charge;       // its bytes in the context's peer_memory_budget, while it lives
  };
  // The target side of a peer's write.
  struct InWrite {
    std::shared_ptr<Registered> reg;  // null when refused, or let go after a withdrawal
    uint64_t rkey = 0, total = 0, received = 0, expected = 0, reserved = 0;
    uint64_t lo = UINT64_MAX, hi = 0;  // the region's bytes its chunks touched: hi - lo <= total
    bool notify = false, cancelled = false;
    // Vectored (kFlagVector): each chunk names its own key; the regions it named, held till the end.
    bool vec = false, refused = false;
    std::unordered_map<uint64_t, std::shared_ptr<Registered>> regs;
    bool withdrawn = false;  // the region was deregistered: the rest is dropped, reg let go once landed
    uint64_t value = 0;
    Status failed;  // a chunk did not arrive (payload path error): the ACK reports it
  };

  EndpointImpl(std::shared_ptr<ContextImpl> ctx, Session session);

  // A vectored operation's refused list: completes at once, naming the entry.
  Request refuse_vec(OpType type, const endpoint::VecBuild& b, const OpOptions& o);
  Request post_send_op(const std::shared_ptr<OpState>& op, const MemRegion& src, uint64_t tag);
  Request post_recv_op(const std::shared_ptr<OpState>& op, const MemRegion& dst);
  // The source of a transfer's next chunk and the bytes left in its segment (vectored: the chunk
  // must not cross one). Caller holds mu_.
  const char* chunk_src(Transfer& t, uint64_t* room) const;
  // Copies `len` bytes at `src` (host memory) into bytes [at, at + len) of a receive's buffer,
  // over its pieces when vectored.
  static Status copy_into(const OpState& op, uint64_t at, const void* src, uint64_t len);
  // A vectored write's state, opened by its first chunk; kProtocol when a chunk changes its form.
  Result<InWrite*> open_vec_write(const wire::FrameHeader& h);
  // A vectored write's chunk at the target, and the regions it holds. Caller holds mu_.
  Result<stream::RxPlan> plan_vec_write(InWrite& w, const wire::FrameHeader& h, uint64_t len);
  static void release_write(InWrite& w);
  // A vectored read's segment request (READ_REQ with kFlagVector): gathered until the last one.
  // `table`: a READ_REQ table's entries (kFlagTable), else empty.
  Status on_read_vec_req(const wire::FrameHeader& h, const std::vector<unsigned char>& table);
  Request post_one_sided(OpType type, const MemRegion& local, const RemoteRegion& remote, uint64_t offset,
                         OpOptions o);
  std::shared_ptr<OpState> new_op(OpType type, const MemRegion& region, const OpOptions& o);
  Request start(const std::shared_ptr<OpState>& op, std::deque<std::shared_ptr<OpState>>& queue);
  void push_control(wire::FrameHeader h, std::vector<unsigned char> payload = {},
                    std::shared_ptr<OpState> op = nullptr);
  // Every frame for the control stream goes through here (endpoint/control.cc).
  void push_item(stream::TxItem item);
  stream::Stream& control_stream() const { return *streams_[static_cast<size_t>(ctl_stream_.load())]; }
  // A frame the peer's request caused: counted against max_reply_backlog (rx_paused).
  void push_reply(wire::FrameHeader h, std::vector<unsigned char> payload = {});
  // The peer caused a refused operation (`what`, logged at most once a second); an error once it
  // has caused more than peer_error_budget within 10 s. Caller holds mu_.
  Status note_refusal(const Status& what);
  void send_ack(uint64_t id, wire::OpKind kind, const Status& s);
  void wake_streams();

  void finish(OpState& op, Status s);
  // By value: callers often pass a pointer held in a table that these functions erase.
  void stop(std::shared_ptr<OpState> op, Status why);
  void settle_stopped(std::shared_ptr<OpState> op);
  // Ends the endpoint with `s` (first reason wins): fail() for breakage, which it reports as
  // "lost the peer" whatever noticed it; end() as given (an orderly close, a violation).
  void fail(Status s);
  void end(Status s);
  // The endpoint stops counting against max_endpoints (and its peer's max_endpoints_per_peer) once:
  // when it fails, is closed, or its peer closed it — not when its threads are done. Caller holds mu_.
  void release_slot();
  void fail_all();
  void deliver();
  void dispatch_notes();  // to the handler, when one is set (after notes_cv_ is notified)
  MetricTransport metric_transport_of(const OpState& op) const;
  bool on_worker_thread() const;
  // A chunk of `op` left this side (written to a socket, or released by a path). Caller holds mu_.
  void chunk_sent(const std::shared_ptr<OpState>& op, uint64_t len, const Status& s);

  // Payload paths (endpoint/paths.cc). A path bit is 1 << path id.
  static uint32_t path_bit(uint8_t id) { return uint32_t{1} << id; }
  // The state of path `id`, or null when no such path runs here.
  PathState* path_state(uint8_t id);
  // The path for a chunk from `src` into a buffer that accepts `accepts` (path bits), in the
  // agreed order. skip: path bits to pass over (Transfer::skip_paths).
  PathState* path_for(const MemSpec& src, uint64_t accepts, uint32_t skip = 0);
  // Receiver: the path bits to announce for a buffer in `dst` (CTS a1, READ_REQ a3): the paths
  // that reach only some buffers (PayloadPath::accepts_any false) and reach this one.
  uint64_t accepts_for(const MemSpec& dst) const;
  // Sender: the path bits a write may take without the target naming them (PayloadPath::lands_writes).
  uint64_t write_accepts() const;
  // Checks a peer's accepting path bits (`what`: the frame). Caller holds mu_.
  Status check_accepts(uint64_t bits, std::string_view what) const;
  // Hands the next chunk of `t` to `ps`; fills the header frame to write. Caller holds mu_.
  Status post_path_chunk(PathState& ps, Transfer& t, uint64_t len, stream::TxItem* out);
  // Table chunks (endpoint/tables.cc): how many of a vectored transfer's next segments go to `ps` as
  // one list (0 or 1: none); hands them over as post_path_chunk does one chunk; and the target's
  // side, a TABLE header on stream 0. Caller holds mu_.
  size_t list_pieces(const PathState& ps, const Transfer& t) const;
  Status post_path_list(PathState& ps, Transfer& t, size_t n, stream::TxItem* out);
  Status on_table_header(PathState& ps, const wire::FrameHeader& h, const std::vector<unsigned char>& payload);
  Result<uint64_t> write_table_dsts(InWrite& w, const wire::FrameHeader& h, const unsigned char* p, size_t n);
  // A vectored write's (or read reply's) run of segments inline as one table chunk (0: not here).
  size_t inline_table_pieces(const Transfer& t, uint64_t chunk) const;
  void post_inline_table(Transfer& t, size_t n, stream::TxItem* out);
  Status on_read_table(PathState& ps, const wire::FrameHeader& h, const std::vector<unsigned char>& payload);
  Result<uint64_t> read_table_dsts(const wire::FrameHeader& h, const unsigned char* p, size_t n, bool* counted);
  // Hands a table chunk's pieces to the path (seq next); undoes and settles it when the path refuses.
  Status post_table(PathState& ps, const wire::FrameHeader& h, const std::vector<unsigned char>& payload,
                    uint64_t len, int host_tag);
  void wake_for(const Transfer& t);  // the streams a new transfer needs
  uint64_t inline_chunk(const Transfer& t) const;  // the chunk of a transfer sent inline
  void note_fallback(const PathState& ps, const Status& why);  // once per path: why it was passed over
  Status chunk_failure(const Status& s) const;  // a path's failed chunk, as the op reports it
  bool post_eager_by_path(const std::shared_ptr<OpState>& op, const MemRegion& src, wire::FrameHeader h);
  // What settling a received path chunk asks of the caller once it has unlocked mu_.
  struct PathRxSettled {
    Status status;         // the endpoint must fail with this (a lost eager message, a bad chunk)
    bool noted = false;    // a notifying write landed
    bool release = false;  // answer PATH_DONE (send_path_done) once the completion is delivered
    uint8_t path = 0;
    uint64_t seq = 0;
  };
  // A path-flagged header with its descriptor arrived on stream 0: a data chunk, or an EAGER
  // whose bytes stay in the sender's memory until this side copies them out by a receiver-releases
  // path (cuda_ipc) — into the matched recv, or else at once into an unexpected buffer (so the
  // sender's memory is released promptly, as for any eager message). Caller holds mu_. A chunk
  // the path moved at once (post_rx_now, the small-chunk lane) is settled here, and `now` says
  // what the caller does after unlocking (wake notification waiters, deliver, PATH_DONE).
  // Runs on the worker of `stream`, which delivered the header.
  Status on_path_header(int stream, const wire::FrameHeader& h, const std::vector<unsigned char>& desc,
                        PathRxSettled* now);
  // A path chunk this side received is done (moved, or failed with `s`). Caller holds mu_.
  PathRxSettled settle_path_rx(uint8_t path, uint64_t seq, const Status& s);
  void send_path_done(uint8_t path, uint64_t seq);
  // A chunk this side sent on `path` is done with (the path's event, or PATH_DONE): settles it and
  // wakes stream 0 (the window has room). False when it is not in flight. Caller holds mu_.
  bool path_chunk_sent(uint8_t path, uint64_t seq, const Status& s);
  // The eager path for a send from `src`, or null (inline eager). Caller holds mu_.
  PathState* eager_path(const MemSpec& src);
  void stop_paths();
  static EndpointStats::PathUse path_use(const PayloadPath& p);

  // Reconnect (endpoint/reconnect.cc). When the last data stream stops and reconnect_timeout is set,
  // the endpoint waits (an outage) instead of failing: the client dials the peer again, the
  // server waits for its REJOIN; both go on by the new streams, or fail with the reason.
  bool reconnect_on() const;
  static constexpr size_t kMaxReconnects = 16;  // per endpoint: each adds its data streams anew
  // The last data stream stopped: starts an outage; false when no reconnect is left (the
  // endpoint fails). Caller holds mu_.
  bool begin_outage(const Status& why);
  void reconnect_loop();  // the reconnect thread: outages, while the endpoint lives
  // Client: dials the peer once for each new data stream; the reason of the last failure.
  // Sets *final when the failure ends the outage (the peer's answer, a dead peer, an ambiguous rejoin).
  Status dial_round(std::unique_lock<std::mutex>& lock, Clock::time_point until, bool* final);
  Status fits_locked(uint16_t first, uint16_t index) const;  // caller holds mu_
  std::unique_ptr<stream::Stream> make_stream(int index, std::unique_ptr<stream::Conduit> conduit);
  void all_stopped();  // the last stream (or the reconnect thread) is done: everything left fails
  bool reconnecting_ = false;  // mu_: in an outage
  bool reconnect_thread_started_ = false;  // mu_
  Clock::time_point outage_since_{};       // mu_
  Status outage_why_, last_dial_;          // mu_: what ended the last stream; the last dial's failure
  uint64_t reconnects_ = 0;                // mu_: outages ended by a rejoin
  int dial_attempts_ = 0;                  // mu_: in this outage
  std::condition_variable reconnect_cv_;   // reconnecting_ and status_ changes
  // mu_ (made with the thread): an eventfd, readable once the endpoint ends, that cuts the reconnect
  // thread's dial short (stream::CancelWaits), so a close does not wait out a dial to a silent peer.
  UniqueFd dial_cancel_;
  void cancel_dial_locked();               // the endpoint ends; caller holds mu_
  std::thread reconnect_thread_;           // joined (or reaped) by the destructor

  // Several links (endpoint/links.cc; Session::multilink). A data chunk this side pulled: kept
  // until the peer acknowledges it (LINK_ACK), sent again by another stream when its stream died
  // before that (LINK_DOWN). Shared with the TxItem (its ctx), which may be written after the ACK.
  struct SentChunk {
    std::shared_ptr<OpState> op;
    wire::FrameHeader header;  // as pulled: no checksum stamped
    const char* src = nullptr;
    MemSpec where;
    uint64_t len = 0;
    bool folded = false;  // its CRC went into the op's (checksums): once, however often it is sent
    // An inline table (TxItem::pieces): its entries and where its pieces' bytes are.
    std::vector<unsigned char> table;
    std::vector<stream::Piece> pieces;
  };
  // Per data stream; index 0 unused. Caller holds mu_ for all below.
  struct LinkState {
    std::deque<std::shared_ptr<SentChunk>> unacked;  // pulled by this stream, in order
    uint64_t acked = 0;   // of this stream's chunks, how many the peer has landed (LINK_ACK)
    uint64_t landed = 0;  // the peer's chunks on this stream that landed here
    struct Arriving {
      wire::FrameHeader header;
      bool counted = false;  // plan_inbound raised the op's inflight
    };
    std::deque<Arriving> arriving;  // headers planned here, payload not yet landed
    bool stopped = false;           // our stream ended: nothing more lands or leaves by it
    bool down_got = false;          // the peer's LINK_DOWN came
    uint64_t peer_landed = 0;       // ... with how many of our chunks it landed
    Status why;                     // why it went down here
  };
  void link_pulled(int stream, stream::TxItem* out, const Transfer* t);  // after next_chunk filled `out`
  bool link_resend(int stream, stream::TxItem* out);                  // a dead link's chunk, if any
  void link_sent(int stream, stream::TxItem& item);                   // on_sent of a pulled chunk
  void link_planned(int stream, const wire::FrameHeader& h, const stream::RxPlan& plan);
  void link_landed(int stream, const wire::FrameHeader& h);
  bool link_failed(int stream, const Status& s);  // true: the endpoint goes on without that stream
  void link_stopped(int stream);
  Status on_link_ack(int stream, const wire::FrameHeader& h);
  Status on_link_down(int stream, const wire::FrameHeader& h);
  void link_requeue(int k);  // both sides are done with stream k: its unlanded chunks go again
  void link_acked(int k, uint64_t upto);
  std::vector<MemRegion> list_srcs_, list_dsts_;     // table chunks' scratch (endpoint/tables.cc)
  std::vector<LinkState> links_;                    // multilink only: per stream (0: the control frames' LINK_DOWN)
  std::deque<std::shared_ptr<SentChunk>> resend_;  // chunks to send again, before tx_
  int links_alive_ = 0;                             // data streams not stopped

  // The control stream (endpoint/control.cc; Session::multilink). Control frames (all but data
  // chunks, KEEPALIVE, LINK_ACK, LINK_DOWN) are counted on both sides and kept by the sender until
  // the peer's count (LINK_ACK/LINK_DOWN a2) covers them; when the stream carrying them stops, they
  // go again, beyond the peer's final count for it, on the lowest stream still up.
  static bool counted_control(const wire::FrameHeader& h);
  // The peer's count of our control frames (a2 of `h`). Caller holds mu_.
  Status ctl_acked(const wire::FrameHeader& h);
  // Stream `k` stopped here; returns whether the control stream moved. Caller holds mu_.
  bool ctl_stream_stopped(int k);
  // After the control stream moved: LINK_DOWN and LINK_ACK frames it carried, again. Caller holds mu_.
  void ctl_repeat_links();
  // Both sides are done with stream k: the control frames it did not land go again. Caller holds mu_.
  void ctl_resend_if_ready(int k);
  void ctl_push_ack();  // LINK_ACK(0, 0, ctl_landed_); caller holds mu_
  void ctl_landed(const wire::FrameHeader& h);  // a frame of the peer's landed here; caller holds mu_
  std::mutex ctl_mu_;   // guards the ctl_ members below, but ctl_stream_ (written under it) and those marked mu_
  std::atomic<int> ctl_stream_{0};  // where control frames go now
  int ctl_used_ = 0;                // the stream counted frames last went to
  bool ctl_hold_ = false;           // ctl_used_ stopped: counted frames wait in the log for the peer's count
  uint64_t ctl_sent_ = 0, ctl_acked_ = 0, ctl_log_bytes_ = 0;
  std::deque<stream::TxItem> ctl_log_;  // frames ctl_acked_ + 1 .. ctl_sent_
  std::atomic<bool> ctl_overflow_{false};  // the peer acknowledges none: on_tick fails the endpoint
  std::vector<wire::FrameHeader> downs_sent_;  // mu_: our LINK_DOWNs, repeated when the control stream moves
  uint64_t ctl_landed_ = 0, ctl_ack_sent_ = 0;  // mu_: the peer's control frames landed here, and acknowledged
  Clock::time_point ctl_ack_due_ = Clock::time_point::max();  // mu_

  // Checksums (endpoint/checksum.cc). A data frame carries its CRC32C exactly when the session
  // agreed checksums (a protocol error otherwise). Caller holds mu_ unless said.
  Status check_flag(const wire::FrameHeader& h) const;
  // The landed bytes' CRC against the header's: ok, or kDataLoss (counted, logged at most once a
  // second).
  Status verify(const wire::FrameHeader& h, uint32_t landed);
  // Without mu_: the CRC of a path chunk's landed bytes against its header (device memory: on the
  // device, waiting for it).
  Status verify_path_chunk(const wire::FrameHeader& h, const MemRegion& dst);
  // Folds a chunk's CRC into its operation's (OpState::crc_raw).
  static void fold_chunk(OpState& op, uint64_t offset, uint64_t len, uint32_t crc);
  // Sender: the offset within its operation of a data frame's chunk.
  static uint64_t chunk_offset(const OpState& op, const wire::FrameHeader& h);
  // Sender: stamps a path chunk's header with the source's CRC, computed now.
  Status stamp_path_chunk(const MemRegion& src, wire::FrameHeader* h);

  // Receive side (endpoint/rx.cc, matching.cc, one_sided.cc).
  // `len`: the message length (the frame's payload, or what a path's descriptor announced).
  Result<stream::RxPlan> plan_eager(const wire::FrameHeader& h, uint64_t len);
  // An eager message's bytes are in place (plan_eager's host_tag and ctx); `via`: the path bits
  // that carried it (OpState::via); `h`: its header (checksum). `integrity`: not ok when the bytes
  // failed their checksum. Caller holds mu_.
  void eager_landed(int host_tag, const std::shared_ptr<void>& ctx, uint64_t len, const wire::FrameHeader& h,
                    uint32_t via = 0, const Status& integrity = Status());
  Status eager_held_landed(const wire::FrameHeader& h, const stream::RxPlan& held, const Status& integrity);
  Status on_rts(const wire::FrameHeader& h);
  void accept_rendezvous(const std::shared_ptr<OpState>& op, uint64_t msg, uint64_t size, uint64_t tag);
  // `len`: the chunk's length (the frame's payload, or what a path's descriptor announced).
  Result<stream::RxPlan> plan_inbound(std::unordered_map<uint64_t, Inbound>& map, const wire::FrameHeader& h,
                                      uint64_t offset, uint64_t total, uint64_t len, std::string_view what);
  // `moved`: whether the bytes reached the buffer (a path may fail a chunk).
  // `h`: the chunk's header (id: the map's key; a0: its offset; crc).
  Status land_inbound(std::unordered_map<uint64_t, Inbound>& map, const wire::FrameHeader& h, uint64_t len,
                      bool counted, const Status& moved = Status());
  Status on_cts(const wire::FrameHeader& h);
  Result<stream::RxPlan> plan_write(const wire::FrameHeader& h, uint64_t len);
  void land_write(const wire::FrameHeader& h, uint64_t len, const Status& moved = Status());
  Status on_read_req(const wire::FrameHeader& h, const std::vector<unsigned char>& table);
  Status on_ack(const wire::FrameHeader& h, const std::vector<unsigned char>& text);
  Status on_cancel(const wire::FrameHeader& h);
  void match_recv(const std::shared_ptr<OpState>& op, bool front);
  Status consume_unexpected(const std::shared_ptr<Unexpected>& u, const std::shared_ptr<OpState>& op);
  // After the peer's orderly close: completes `op` with the next message of its tag if that one
  // had fully arrived (kept as the peer's completed send promised); false when there is none.
  bool take_after_close(const std::shared_ptr<OpState>& op);
  void return_credit(uint64_t bytes);
  Status check_new_msg(uint64_t msg);
  // `transfer`: the whole operation's length, `in_flight`: the receives (or reads) of its kind in
  // flight, itself included (a large transfer, or a window of them, is received as bulk,
  // RxPlan::bulk).
  stream::RxPlan plan_into(const MemRegion& dst, std::shared_ptr<void> ctx, uint64_t transfer = 0,
                           size_t in_flight = 1) const;

  const std::shared_ptr<ContextImpl> ctx_;
  const Session session_;
  const EngineParams params_;
  StreamTable streams_;  // appended to only by add_stream (reconnect)
  std::unique_ptr<stream::Workers> own_workers_;          // stream_worker_scope=endpoint
  std::vector<PathState> paths_;  // paths_[k - 1]: path id k; fixed after create() but for stop_paths
  uint32_t paths_running_ = 0;    // path bits: started, not yet on_path_stopped (mu_)
  Status stop_error_;          // what did not stop by stop_timeout (mu_); close() returns it
  std::vector<EndpointStats::PathUse> stopped_paths_;  // their last statistics (mu_)
  std::condition_variable paths_cv_;  // paths_running_, and the peer's path chunks landing after its close
  bool has_paths_ = false;
  // Where operations that no payload path carried count: stream 0's conduit (tcp or the shm pipe).
  MetricTransport stream_transport_ = 0;
  uint32_t fallback_noted_ = 0;  // path bits whose "cannot carry a source" was logged (mu_)

  mutable std::mutex mu_;
  Status status_;  // sticky: ok until the endpoint fails or closes
  int running_ = 0;  // workers not yet stopped
  // Worker threads that still hold this endpoint. Shared, so that a thread can say it let go
  // after the endpoint may be gone; close() waits for 0, so the endpoint is destroyed by its
  // owner, which joins the workers (a worker that drops the last reference is joined by the
  // reaper, core/reaper.h).
  struct Holders {
    std::mutex mu;
    std::condition_variable cv;
    int count = 0;
    void add() {
      std::lock_guard<std::mutex> g(mu);
      ++count;
    }
    void release() {
      std::lock_guard<std::mutex> g(mu);
      --count;
      cv.notify_all();  // under the lock: the waiter may release this right after
    }
  };
  std::shared_ptr<Holders> holders_ = std::make_shared<Holders>();
  bool stopped_ = false;  // every worker and path has stopped and fail_all() ran
  bool slot_held_ = false;  // counted in the context (release_slot)
  std::condition_variable stopped_cv_;
  bool delivering_ = false, redeliver_ = false;
  // Operations finished but not yet delivered: lets deliver() skip the lock when there are none
  // (it is called after every chunk). Written under mu_.
  std::atomic<int> undelivered_{0};
  std::deque<std::shared_ptr<OpState>> initiated_, received_;  // completion order per queue
  std::atomic<bool> awaiting_{false};  // == either queue is not empty (written under mu_; StreamHost::awaiting)

  uint64_t next_msg_ = 1, next_op_ = 1, next_token_ = 1;
  int64_t peer_credit_ = 0;
  std::unordered_map<uint64_t, std::shared_ptr<OpState>> sends_;   // rendezvous, by msg
  std::deque<Transfer> tx_;
  std::atomic<bool> has_tx_{false};  // == !tx_.empty(); read without mu_ by polling streams
  // How inline chunks spread over more than one stream: the streams' transport's (tcp). Set
  // before the streams start, never changed.
  std::unique_ptr<Striping> striping_;
  std::deque<std::shared_ptr<OpState>> posted_;                     // unmatched recvs
  std::deque<std::shared_ptr<Unexpected>> unexpected_;
  // The peer closed in order: what it sent before (its sends completed) stays receivable. Once
  // the endpoint has stopped, unexpected_ moves here (bounded by the same budget).
  bool peer_closed_ = false;
  std::deque<std::shared_ptr<Unexpected>> leftover_;
  uint64_t unexpected_bytes_ = 0, credit_owed_ = 0, highest_msg_ = 0;
  std::unordered_map<uint64_t, Inbound> tokens_;                    // matched recvs, by token
  std::unordered_map<uint64_t, uint64_t> token_of_msg_;
  std::unordered_map<uint64_t, std::shared_ptr<OpState>> writes_;  // awaiting ACK, by op id
  std::unordered_map<uint64_t, Inbound> reads_;                     // by op id
  std::unordered_map<uint64_t, InWrite> in_writes_;                 // peer's writes, by its op id
  std::unordered_map<uint64_t, std::shared_ptr<OpState>> serving_;  // our answers to the peer's reads
  // The peer's vectored reads whose segment requests are still arriving, by op id; their memory is
  // charged to the context's peer_memory_budget.
  struct VecReadReq {
    std::shared_ptr<VecLayout> layout = std::make_shared<VecLayout>();
    std::vector<std::shared_ptr<Registered>> regs;  // held (acquired) until served or refused
    std::unordered_map<uint64_t, Registered*> by_key;
    Status refused;  // served as refused (ACK) once the last segment came
    uint64_t accepts = 0;
    uint64_t announced = 0;  // segments announced, kept or not
    std::vector<MemoryBudget::Charge> charges;  // one per kVecChargeSegs segments
  };
  std::unordered_map<uint64_t, VecReadReq> vec_reads_;
  // One segment of read `id` (a READ_REQ's, or an entry of its table) into `v`.
  Status add_read_segment(uint64_t id, VecReadReq& v, uint64_t key, uint64_t offset, uint64_t length);
  std::deque<Notification> notes_;  // at most params_.max_notifications
  Clock::time_point refusals_since_{};
  int refusals_ = 0;  // within the 10 s from refusals_since_
  LogLimiter peer_log_;  // lines the peer can cause again and again
  std::condition_variable notes_cv_;
  // Endpoint::on_notification's handler (shared: a dispatch in progress keeps its copy).
  std::shared_ptr<std::function<void(const Notification&)>> note_handler_;
  std::atomic<bool> has_note_handler_{false};
  bool noting_ = false;  // a thread is in dispatch_notes()' loop
  std::multimap<Clock::time_point, std::weak_ptr<OpState>> deadlines_;
  std::atomic<int64_t> next_deadline_ns_{INT64_MAX};
  const Clock::time_point created_ = Clock::now();
  Clock::time_point evicted_stop_at_ = Clock::time_point::max();  // evicted: the streams stop then (mu_)

  struct Counters {
    uint64_t messages_sent = 0, messages_received = 0, eager = 0, rendezvous = 0, writes = 0, reads = 0;
    uint64_t host_copies = 0, host_copy_bytes = 0;
    uint64_t checksum_errors = 0;
  } counters_;

  // Kernel-initiated operations (endpoint/device.cc). Last: destroyed first, its thread stopped
  // before anything it posts on goes.
  mutable std::mutex device_mu_;  // device_link_
  std::shared_ptr<DeviceLink> device_link_;
};

}  // namespace dmx
