// The devmem payload path: see devmem_path.h for the contract and the design choices.
#include "transport/devmem/devmem_path.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>

#include "core/log.h"
#include "memory/backend.h"
#include "memory/copy_queues.h"
#include "transport/devmem/devmem_path_rx.h"
#include "transport/devmem/devmem_path_stage.h"
#include "transport/path_base.h"
#include "transport/devmem/region.h"
#include "transport/devmem/tx.h"
#include "transport/devmem/tx_regions.h"

namespace dmx {
namespace {

using devmem::BoundRegion;
using devmem::DevmemTx;
using devmem::Stager;
using devmem::SwitchGatherer;

constexpr auto kDeviceWait = std::chrono::seconds(10);  // a copy or gather that takes longer: device failure
constexpr auto kQuiesceWait = std::chrono::seconds(5);  // stop/fail: bounded wait for user memory copies
constexpr int kRxCallsPerRound = 16;                     // recvmsg calls before looking at TX again
constexpr int kZcrxPollMs = 20;                          // longest sleep on the zcrx eventfd while receiving

bool host_memory(const MemSpec& m) { return m.kind == MemKind::kHost || m.kind == MemKind::kPinned; }

std::vector<unsigned char> length_descriptor(uint64_t len) {
  std::vector<unsigned char> d(kDevmemDescriptorSize);
  for (size_t i = 0; i < 8; ++i) d[i] = static_cast<unsigned char>(len >> (8 * i));
  return d;
}

class DevmemPath final : public PathBase {
 public:
  struct Parts {
    std::shared_ptr<void> steering;  // the NIC flow rule of the data socket; released after the socket
    UniqueFd fd;
    std::string peer;
    devmem::HostSeams seams;
    devmem::PlacedMemory ring;  // the TX ring, from the machine's placement (or the path's own)
    std::unique_ptr<BoundRegion> tx_bound;
    std::unique_ptr<devmem::KernelSocket> sock;
    std::unique_ptr<SwitchGatherer> gatherer;
    std::unique_ptr<Stager> stager;
    std::unique_ptr<devmem::PathRx> rx;  // zcrx or devmem RX (devmem_path_rx.h)
    std::string rx_note;                 // which receiver, and why not the other
    std::unique_ptr<DevmemTx> tx;
  };
  explicit DevmemPath(Parts p)
      : PathBase({.thread_name = "dmx-devmem",
                  .stopped = Status(Code::kClosed, "devmem path stopped").with_peer(p.peer)}),
        p_(std::move(p)) {}
  ~DevmemPath() override { end_thread(); }

  std::string_view name() const override { return "devmem"; }

  bool carries(const MemSpec& src) const override {
    if (src.kind == MemKind::kCuda) return host_memory(p_.seams.memory) || src.device == p_.seams.memory.device;
    return src.kind == MemKind::kSim && host_memory(p_.seams.memory);
  }
  bool accepts(const MemSpec& dst) const override { return gatherable(dst); }
  bool accepts_any() const override { return false; }
  // A chunk for a destination the gatherer cannot write lands in the landing zone and is copied on.
  bool lands_writes() const override { return true; }
  uint64_t max_chunk() const override { return kDevmemMaxChunk; }

  Result<std::vector<unsigned char>> post_tx(uint64_t seq, const MemRegion& src, bool /*whole*/) override {
    if (!carries(src.where))
      return Status(Code::kInvalidArgument, fmt::format("devmem path: does not carry {} sources", to_string(src.where)));
    if (src.size > kDevmemMaxChunk)
      return Status(Code::kInvalidArgument,
                    fmt::format("devmem path: chunk of {} bytes above the {}-byte maximum", src.size, kDevmemMaxChunk));
    DMX_RETURN_IF_ERROR(post([&] { tx_posts_.push_back(TxSeg{seq, src}); }));
    return length_descriptor(src.size);
  }

  size_t max_list() const override { return kDevmemMaxList; }

  Result<std::vector<unsigned char>> post_tx_list(uint64_t seq, std::span<const MemRegion> srcs,
                                                  size_t* taken) override {
    if (srcs.empty() || !carries(srcs[0].where))
      return Status(Code::kUnavailable, "devmem path: a list of sources it does not carry");
    size_t n = 0;
    uint64_t total = 0;
    for (; n < srcs.size() && n < kDevmemMaxList; ++n) {  // one kind of memory: one stager queue
      const MemRegion& r = srcs[n];
      if (r.where != srcs[0].where || r.size == 0 || r.size > kDevmemMaxChunk - total) break;
      total += r.size;
    }
    if (n == 0)
      return Status(Code::kInvalidArgument, fmt::format("devmem path: a list whose first piece is {} bytes", srcs[0].size));
    TxSeg t{seq, MemRegion{srcs[0].ptr, total, srcs[0].where}};
    t.pieces.assign(srcs.begin(), srcs.begin() + static_cast<ptrdiff_t>(n));
    DMX_RETURN_IF_ERROR(post([&] { tx_posts_.push_back(std::move(t)); }));
    *taken = n;
    return length_descriptor(total);
  }

  Result<uint64_t> chunk_length(std::span<const unsigned char> descriptor) override {
    return decode_length_descriptor(descriptor, kDevmemMaxChunk, "devmem", p_.peer);
  }


  Status post_rx(uint64_t seq, std::span<const unsigned char> descriptor, const MemRegion& dst) override {
    DMX_ASSIGN_OR_RETURN(uint64_t len, chunk_length(descriptor));
    if (dst.ptr != nullptr && dst.size != len)
      return Status(Code::kInvalidArgument,
                    fmt::format("devmem path: destination of {} bytes for a {}-byte chunk", dst.size, len));
    RxItem item{seq, len, dst};
    item.land = dst.ptr != nullptr && len > 0 && !gatherable(dst.where);
    return post([&] { rx_posts_.push_back(std::move(item)); });
  }

  Status post_rx_list(uint64_t seq, std::span<const unsigned char> descriptor,
                      std::span<const MemRegion> dsts) override {
    DMX_ASSIGN_OR_RETURN(uint64_t len, chunk_length(descriptor));
    if (dsts.empty() || dsts.size() > kDevmemMaxList)
      return Status(Code::kProtocol, fmt::format("devmem path: a list of {} pieces", dsts.size())).with_peer(p_.peer);
    bool drop = dsts[0].ptr == nullptr, land = false;
    uint64_t sum = 0;
    for (const MemRegion& d : dsts) {
      if ((d.ptr == nullptr) != drop)
        return Status(Code::kInvalidArgument, "devmem path: a list with some destinations null");
      sum += d.size;  // each at most the wire's 1 MiB piece: no overflow
      land = land || !gatherable(d.where);
    }
    if (sum != len)
      return Status(Code::kProtocol, fmt::format("devmem path: a list descriptor of {} bytes for pieces of {} bytes",
                                                 len, sum))
          .with_peer(p_.peer);
    RxItem item{seq, len, drop ? MemRegion{nullptr, len, {}} : MemRegion{dsts[0].ptr, len, dsts[0].where}};
    if (!drop) item.pieces.assign(dsts.begin(), dsts.end());
    item.land = !drop && land;
    return post([&] { rx_posts_.push_back(std::move(item)); });
  }

  bool receiver_releases() const override { return false; }

  DevmemPathCounters counters() const {
    std::lock_guard<std::mutex> lock(stats_mu_);
    DevmemPathCounters c = devmem_counters_;
    c.rx_note = p_.rx_note;  // fixed at creation
    return c;
  }

  std::string describe() const override {
    std::string note;
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      note = last_tx_note_.empty() ? std::string() : "; last TX from " + last_tx_note_;
      if (!landing_note_.empty()) note += "; landing zone " + landing_note_;
    }
    return fmt::format("devmem {}: RX by {}; {} MiB TX ring (binding {}) from {}{}", p_.seams.ifname, p_.rx_note,
                       p_.ring.region.size >> 20, tx_binding_, p_.ring.where, note);
  }

  void set_tx_binding(uint32_t tx) { tx_binding_ = tx; }

 private:
  // TX chunk lifecycle:  kNew -> kStaging (copy into the ring enqueued) -> kStaged (copy done:
  // on_path_tx_done) -> kSending (bytes being queued on the socket, in order) -> kInFlight (all
  // queued; the ring space is freed when the kernel reports the zerocopy completion).
  enum class TxState { kNew, kStaging, kStaged, kSending, kInFlight };
  struct TxSeg {
    uint64_t seq;
    MemRegion src;
    TxState state = TxState::kNew;
    uint64_t ring_off = 0;
    Stager::Fence fence{};
    uint64_t ticket = 0;
    bool reported = false;  // on_path_tx_done delivered (the source is free)
    // Sent straight from a registered region bound for TX (no ring, no staging): the source is in
    // use until the zerocopy completion; the region is kept alive until then.
    std::shared_ptr<devmem::TxRegion> region{};
    devmem::TxBindingInfo direct{};
    uint64_t direct_off = 0;
    std::vector<MemRegion> pieces{};  // a list (post_tx_list), gathered into the ring; src spans its total
  };
  // RX chunk: queued -> receiving (bytes read, gathers enqueued) -> finished (gathers complete,
  // tokens back: on_path_rx_done).
  struct RxItem {
    uint64_t seq;
    uint64_t len;
    MemRegion dst;
    Status status{};  // a chunk-only error (dropped): reported at its completion
    size_t got = 0;
    bool land = false;  // dst is memory the gatherer cannot write: gathered into the landing zone first
    // A list (post_rx_list): dst marks it (ptr and kind of the first piece, the total length); the
    // bytes go into pieces[piece] from piece_got on.
    std::vector<MemRegion> pieces{};
    size_t piece = 0, piece_got = 0;
  };
  // A landed chunk on its way from the landing zone to its destination: complete at the fence.
  struct LandingCopy {
    uint64_t seq;
    Status status;                                    // a failed enqueue: the chunk completes with it
    std::vector<std::pair<CopyQueue*, uint64_t>> fences;  // empty: copied already (host to host)
  };
  bool gatherable(const MemSpec& dst) const {
    if (p_.seams.gathers_into) return p_.seams.gathers_into(dst);
    if (host_memory(p_.seams.memory)) return dst.kind != MemKind::kCuda;  // the host gatherer: host, pinned, sim
    return dst == p_.seams.memory;
  }
  // Moves what was posted into the I/O queues. Caller holds io_mu_.
  void take_all_posts() {
    take_posts([&] {
      for (auto& t : tx_posts_) tx_.push_back(std::move(t));
      for (auto& r : rx_posts_) rx_.push_back(std::move(r));
      tx_posts_.clear();
      rx_posts_.clear();
    });
  }

  // --- PathBase's hooks (the progress thread) ---

  // One round of I/O under io_mu_; an error fails the path. No spin: idle() polls with the plan's
  // timeout (0 while there is more to do now).
  bool progress(std::vector<Done>* done) override {
    std::lock_guard<std::mutex> io(io_mu_);
    if (quiesced_) return false;  // stop() came
    take_all_posts();
    Status s = round(*done);
    if (!s.ok()) fail_locked(std::move(s));
    publish_stats();
    return false;
  }

  bool idle() override {
    pollfd fds[2] = {{-1, 0, 0}, {-1, 0, 0}};
    int timeout;
    {
      std::lock_guard<std::mutex> io(io_mu_);
      if (quiesced_) return false;
      timeout = poll_plan(&fds[0], &fds[1]);
    }
    bool woke = sleep_on(std::span<pollfd>(fds, fds[1].fd >= 0 ? 2 : fds[0].fd >= 0 ? 1 : 0),
                         timeout < 0 ? std::nullopt
                                     : std::optional<std::chrono::microseconds>(std::chrono::milliseconds(timeout)));
    if (woke && fds[0].fd >= 0) last_revents_ = fds[0].revents;
    return woke;
  }

  // stop(): waits for the thread's current round (never for an event), then for the copies into
  // and out of user memory (bounded).
  void quiesce() override {
    std::lock_guard<std::mutex> io(io_mu_);
    quiesce_locked();
  }

  void release(const Status& why, std::vector<Done>* done) override {
    std::lock_guard<std::mutex> io(io_mu_);
    quiesce_locked();
    take_all_posts();
    for (auto& t : tx_)
      if (!t.reported) done->push_back({true, t.seq, why});
    for (auto& r : rx_) done->push_back({false, r.seq, why});
    if (landing_copy_) done->push_back({false, landing_copy_->seq, why});
    landing_copy_.reset();
    tx_.clear();
    rx_.clear();
    publish_stats();
  }

  // One round of I/O (io_mu_ held). An error is a failure of the path.
  Status round(std::vector<Done>& events) {
    DMX_RETURN_IF_ERROR(check_socket());
    DMX_RETURN_IF_ERROR(tx_round(events));
    DMX_RETURN_IF_ERROR(rx_round(events));
    return check_unclaimed();
  }

  // What poll() should wait for on the data socket (and the receiver's own fd), and how long.
  int poll_plan(pollfd* pfd, pollfd* rx_fd) {
    short ev = 0;
    int timeout = -1;
    pollfd ready = p_.rx ? p_.rx->ready_fd() : pollfd{-1, 0, 0};
    if (!rx_.empty() && ready.fd < 0) ev |= POLLIN;
    if (!rx_.empty() && ready.fd >= 0) {
      *rx_fd = ready;
      timeout = kZcrxPollMs;  // a missed wake-up costs latency, never a hang
    }
    if (rx_.empty() && !peer_shut_) ev |= POLLRDHUP;  // no receive posted: learn when the peer stops sending
    if (tx_blocked_) ev |= POLLOUT;
    bool device_work = landing_copy_.has_value() || std::any_of(tx_.begin(), tx_.end(), [](const TxSeg& t) {
      return t.state == TxState::kStaging || t.state == TxState::kInFlight;
    });
    // Staging copies and (over the double) zerocopy completions have no fd to wait on.
    if (device_work) timeout = 1;
    if (unclaimed_since_ || (ready.fd >= 0 && peer_shut_ && rx_.empty())) timeout = timeout < 0 ? 50 : std::min(timeout, 50);
    if (!tx_.empty() && !device_work && !tx_blocked_) timeout = 0;  // more to stage or send now
    if (!rx_.empty() && rx_.front().len == 0) timeout = 0;
    if (ev != 0 || timeout >= 0) {
      pfd->fd = p_.fd.get();
      pfd->events = ev;
    }
    return timeout;
  }

  // A socket error (peer reset) while idle would make poll return at once forever: fail on it.
  Status check_socket() {
    short rev = std::exchange(last_revents_, 0);
    if (rev & (POLLERR | POLLHUP)) {
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(p_.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0)
        return errno_status("devmem data connection", err, Code::kPeerFailed);
      if ((rev & POLLHUP) && rx_.empty() && tx_.empty())
        peer_shut_ = true;  // a later post fails on its first call
    }
    if ((rev & POLLRDHUP) && rx_.empty()) peer_shut_ = true;
    return Status();
  }

  // Bytes on the socket that no receive claims while the peer has stopped sending: more than it
  // announced. Bytes that merely arrived before their header (stream 0 lags) are claimed soon.
  Status check_unclaimed() {
    if (!rx_.empty() || !peer_shut_) {
      unclaimed_since_.reset();
      return Status();
    }
    int avail = 0;
    if (::ioctl(p_.fd.get(), FIONREAD, &avail) != 0) avail = 0;
    DMX_ASSIGN_OR_RETURN(uint64_t held, p_.rx->unclaimed());
    avail += static_cast<int>(std::min<uint64_t>(held, 1 << 30));
    if (avail <= 0) {
      unclaimed_since_.reset();
      return Status();
    }
    auto now = std::chrono::steady_clock::now();
    if (!unclaimed_since_) unclaimed_since_ = now;
    if (now - *unclaimed_since_ < std::chrono::milliseconds(kDevmemExtraGraceMs)) return Status();
    Status s = p_.rx->reject_unexpected();
    if (s.ok()) s = Status(Code::kProtocol, fmt::format("peer sent {} bytes more than it announced", avail));
    return s;
  }

  Status tx_round(std::vector<Done>& events) {
    if (tx_.empty()) return Status();
    DMX_RETURN_IF_ERROR(p_.tx->poll_completions());
    retire(events);
    for (auto& t : tx_) {
      if (t.state == TxState::kNew) {
        if (t.src.size == 0) {
          t.state = TxState::kStaged;
          t.reported = true;
          events.push_back({true, t.seq, Status()});
          continue;
        }
        if (t.pieces.empty() && try_direct(t)) continue;
        auto off = ring_alloc(t.src.size);
        if (!off) break;  // ring full: later chunks wait (order is kept)
        t.ring_off = *off;
        auto srcs = t.pieces.empty() ? std::span<const MemRegion>(&t.src, 1) : std::span<const MemRegion>(t.pieces);
        DMX_ASSIGN_OR_RETURN(t.fence, p_.stager->enqueue(srcs, p_.ring.region.sub(t.ring_off, t.src.size)));
        t.state = TxState::kStaging;
        ++stagings_;
      }
      if (t.state == TxState::kStaging) {
        DMX_ASSIGN_OR_RETURN(bool done, p_.stager->done(t.fence));
        if (!done) continue;
        t.state = TxState::kStaged;
        t.reported = true;
        events.push_back({true, t.seq, Status()});  // the source is free again
      }
    }
    // Send in order: the byte order on the data socket is the order of the headers on stream 0.
    tx_blocked_ = false;
    for (auto& t : tx_) {
      if (t.state == TxState::kInFlight) continue;
      if (t.state == TxState::kStaged) {
        if (t.region) {
          DMX_ASSIGN_OR_RETURN(t.ticket, p_.tx->start_send(t.direct_off, t.src.size, t.direct));
        } else {
          DMX_ASSIGN_OR_RETURN(t.ticket, p_.tx->start_send(p_.tx_bound->tx_offset(t.ring_off), t.src.size));
        }
        t.state = TxState::kSending;
      }
      if (t.state != TxState::kSending) break;
      DMX_ASSIGN_OR_RETURN(bool queued, p_.tx->push_send(t.ticket));
      if (!queued) {
        tx_blocked_ = true;
        break;
      }
      t.state = TxState::kInFlight;
    }
    retire(events);
    return Status();
  }

  // Ring space comes back in FIFO order once the kernel is done with it; a direct send's source
  // is free (on_path_tx_done) only then.
  void retire(std::vector<Done>& events) {
    while (!tx_.empty() && tx_.front().state == TxState::kInFlight && p_.tx->completed(tx_.front().ticket)) {
      if (!tx_.front().reported) events.push_back({true, tx_.front().seq, Status()});
      tx_.pop_front();
    }
  }

  // A source inside a registered region that is (or can now be) bound for TX on this NIC goes
  // straight from it. Otherwise the ring, and the reason is kept for describe().
  bool try_direct(TxSeg& t) {
    auto r = devmem::find_tx_region(t.src);
    if (!r) {
      ++ring_sends_;
      set_tx_note("ring: the source is not inside registered memory");
      return false;
    }
    auto b = r->bound_for(p_.seams);
    if (!b.ok()) {
      ++ring_sends_;
      set_tx_note("ring: " + b.status().message());
      return false;
    }
    t.region = std::move(r);
    t.direct = (*b)->tx_info();
    t.direct_off = (*b)->tx_offset(reinterpret_cast<uintptr_t>(t.src.ptr) -
                                   reinterpret_cast<uintptr_t>(t.region->memory().ptr));
    t.state = TxState::kStaged;  // nothing to copy; reported at its completion
    ++direct_sends_;
    set_tx_note(fmt::format("registered region (binding {})", t.direct.dmabuf_id));
    return true;
  }
  void set_tx_note(std::string note) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    if (note != last_tx_note_) DMX_LOG_INFO("devmem path to {}: TX from {}", p_.peer, note);
    last_tx_note_ = std::move(note);
  }

  // A contiguous range of the ring for `len` bytes; ranges are freed in allocation order.
  std::optional<uint64_t> ring_alloc(uint64_t len) {
    uint64_t size = p_.ring.region.size;
    bool any = false;
    uint64_t tail = 0;  // start of the oldest live range
    for (const auto& t : tx_) {
      if (t.state != TxState::kNew && t.src.size > 0 && !t.region) {
        tail = t.ring_off;
        any = true;
        break;
      }
    }
    if (!any) {
      ring_head_ = 0;
      return len <= size ? std::optional<uint64_t>(0) : std::nullopt;
    }
    uint64_t at;
    if (ring_head_ > tail) {  // live data in [tail, head)
      if (size - ring_head_ >= len) at = ring_head_;
      else if (tail >= len) at = 0;
      else return std::nullopt;
    } else {  // wrapped: live data in [tail, size) and [0, head)
      if (tail - ring_head_ >= len) at = ring_head_;
      else return std::nullopt;
    }
    ring_head_ = at + len;
    return at;
  }

  Status rx_round(std::vector<Done>& events) {
    landing_round(events);
    for (int calls = 0; !rx_.empty() && calls < kRxCallsPerRound;) {
      RxItem& r = rx_.front();
      if (r.got < r.len) {
        if (r.land && r.status.ok()) {
          if (landing_copy_) break;  // the zone still holds the last landed chunk: wait for its copy
          if (r.got == 0) {
            if (Status s = ensure_landing(r.len); !s.ok()) {
              r.status = std::move(s);  // consumed and dropped, that chunk only
              r.land = false;
            }
          }
        }
        bool discard = r.dst.ptr == nullptr || !r.status.ok();
        p_.gatherer->discard = discard;
        size_t before = r.got;
        if (!discard && !r.land && !r.pieces.empty()) {
          DMX_RETURN_IF_ERROR(receive_piece(r));
        } else {
          MemRegion dst = discard  ? MemRegion{nullptr, r.len, p_.seams.memory}
                          : r.land ? landing_->region.sub(0, r.len)
                                   : r.dst;
          DMX_RETURN_IF_ERROR(p_.rx->receive_some(dst, &r.got, Deadline::after(kDeviceWait)));
        }
        ++calls;
        if (r.got == before) break;  // nothing ready: poll for POLLIN
        if (r.got < r.len) continue;
        DMX_RETURN_IF_ERROR(p_.rx->finish(Deadline::after(kDeviceWait)));
        p_.gatherer->discard = false;
      }
      ++received_;
      received_bytes_ += r.len;
      if (r.land && r.status.ok()) {  // complete once copied on (landing_round)
        landing_copy_ = copy_on(r);
        rx_.pop_front();
        landing_round(events);
        continue;
      }
      events.push_back({false, r.seq, r.status});
      rx_.pop_front();
    }
    return Status();
  }

  // A list's bytes go into its pieces in order; the gathers of them all are waited for once, in
  // finish().
  Status receive_piece(RxItem& r) {
    const MemRegion& d = r.pieces[r.piece];
    size_t from = r.piece_got;
    DMX_RETURN_IF_ERROR(p_.rx->receive_some(d, &r.piece_got, Deadline::after(kDeviceWait)));
    r.got += r.piece_got - from;
    if (r.piece_got == d.size) {
      ++r.piece;
      r.piece_got = 0;
    }
    return Status();
  }

  // The landing zone (at least `len` bytes), made at its first use: from the machine's placement
  // (the seams'), else a buffer in the pool's memory. A refusal is kept: later chunks say it again.
  Status ensure_landing(uint64_t len) {
    if (landing_ && landing_->region.size >= len) return Status();
    if (!landing_failed_.ok()) return landing_failed_;
    auto z = devmem::place_memory(p_.seams, devmem::MemoryUse::kLanding, kDevmemMaxChunk, p_.peer);
    if (z.ok() && (z->region.size < len || !gatherable(z->region.where)))
      z = Status(Code::kInternal, fmt::format("the landing zone {} ({} bytes of {}) is not memory the gatherer writes",
                                              z->where, z->region.size, to_string(z->region.where)));
    if (!z.ok()) {
      landing_failed_ = Status(Code::kUnavailable,
                               fmt::format("devmem path: no landing zone for destinations the gatherer cannot write: {}",
                                           z.status().message()))
                            .with_peer(p_.peer);
      DMX_LOG_WARN("devmem path to {}: {}", p_.peer, landing_failed_.message());
      return landing_failed_;
    }
    landing_ = std::move(*z);
    std::lock_guard<std::mutex> lock(stats_mu_);
    landing_note_ = landing_->where;
    DMX_LOG_INFO("devmem path to {}: chunks for memory the gatherer cannot write land in {}", p_.peer, landing_note_);
    return Status();
  }

  // Enqueues the copies of a landed chunk from the zone to its destination (a list: to each of its
  // pieces, each by its own device's queue; one fence per queue used).
  LandingCopy copy_on(const RxItem& r) {
    LandingCopy c{r.seq, Status(), {}};
    ++landed_chunks_;
    landed_bytes_ += r.len;
    std::span<const MemRegion> dsts = r.pieces.empty() ? std::span<const MemRegion>(&r.dst, 1) : r.pieces;
    uint64_t at = 0;
    for (const MemRegion& d : dsts) {
      MemRegion from = landing_->region.sub(at, d.size);
      at += d.size;
      if (host_memory(from.where) && host_memory(d.where)) {
        std::memcpy(d.ptr, from.ptr, d.size);
        continue;
      }
      if (Status s = enqueue_copy_on(from, d, &c); !s.ok()) {
        c.status = Status(s.code(), fmt::format("devmem path: copying a landed chunk of {} bytes from {} to {}: {}",
                                                d.size, to_string(from.where), to_string(d.where), s.message()))
                       .with_peer(p_.peer);
        break;  // what was enqueued is waited for (landing_round), then the chunk fails
      }
    }
    for (auto& [queue, fence] : c.fences)
      if (Result<uint64_t> f = queue->record(); f.ok()) fence = *f;
      else if (c.status.ok()) c.status = f.status().with_peer(p_.peer);
    return c;
  }

  Status enqueue_copy_on(const MemRegion& from, const MemRegion& d, LandingCopy* c) {
    // A device zone: its device's queue (to the host, or to another device's memory it reaches);
    // a host zone: the destination device's queue.
    MemSpec dev = host_memory(from.where) ? d.where : from.where;
    DMX_ASSIGN_OR_RETURN(CopyQueue * q, landing_queues_.get(dev));
    if (host_memory(from.where)) DMX_RETURN_IF_ERROR(q->to_device(d.ptr, from.ptr, d.size));
    else if (host_memory(d.where)) DMX_RETURN_IF_ERROR(q->to_host(d.ptr, from.ptr, d.size));
    else DMX_RETURN_IF_ERROR(q->copy(d.ptr, from.ptr, d.size));
    if (std::none_of(c->fences.begin(), c->fences.end(), [q](const auto& f) { return f.first == q; }))
      c->fences.emplace_back(q, 0);
    return Status();
  }

  // Completes the landed chunk whose copy on has finished; the zone is free again.
  void landing_round(std::vector<Done>& events) {
    if (!landing_copy_) return;
    Status s = landing_copy_->status;
    for (auto& [queue, fence] : landing_copy_->fences) {
      if (fence == 0) continue;  // its record failed (status says so): nothing to wait for
      Result<bool> done = queue->done(fence);
      if (done.ok() && !*done) return;
      if (!done.ok() && s.ok()) s = done.status().with_peer(p_.peer);
    }
    events.push_back({false, landing_copy_->seq, s});
    landing_copy_.reset();
  }

  void fail_locked(Status s) {
    if (s.peer().empty()) s = s.with_peer(p_.peer);
    s = s.with_origin("devmem/path");
    DMX_LOG_ERROR("devmem path: {}", s.to_string());
    fail(std::move(s));
    quiesce_locked();  // user memory is free before the chunks complete
  }

  // Waits (bounded) for every copy out of user sources and into user destinations, returns every
  // token and closes the data socket. io_mu_ held. Idempotent.
  void quiesce_locked() {
    if (quiesced_) return;
    quiesced_ = true;
    Deadline d = Deadline::after(kQuiesceWait);
    for (auto& t : tx_)
      if (t.state == TxState::kStaging) (void)p_.stager->wait(t.fence, d);
    // The NIC reads the ring (or, for direct sends, the user's memory) until the zerocopy
    // completions; wait for them (bounded) before the ring, or the user's buffer, is let go.
    for (auto& t : tx_)
      if (t.state == TxState::kInFlight || t.state == TxState::kSending)  // user memory (direct): the full bound
        (void)p_.tx->wait(t.ticket, t.region ? d : Deadline::after(std::chrono::milliseconds(200)));
    if (landing_copy_)  // writing into user memory
      for (auto& [queue, fence] : landing_copy_->fences)
        if (fence != 0) (void)queue->wait(fence, d);
    publish_stats();
    p_.rx.reset();  // waits (bounded) for its gathers and returns every token
    p_.tx.reset();
    p_.sock.reset();
    ::shutdown(p_.fd.get(), SHUT_RDWR);
  }

  void publish_stats() {
    std::lock_guard<std::mutex> lock(stats_mu_);
    if (p_.rx) p_.rx->counters(&devmem_counters_);
    if (p_.tx) {
      const auto& t = p_.tx->stats();
      devmem_counters_.sendmsg_calls = t.sendmsg_calls;
      devmem_counters_.notifications = t.notifications;
      devmem_counters_.zerocopy_copied = t.copied;
      counters_.chunks_sent.store(t.sends, std::memory_order_relaxed);
      counters_.bytes_sent.store(t.bytes, std::memory_order_relaxed);
    }
    devmem_counters_.stagings = stagings_;
    devmem_counters_.direct_sends = direct_sends_;
    devmem_counters_.ring_sends = ring_sends_;
    devmem_counters_.tx_note = last_tx_note_;
    devmem_counters_.landed_chunks = landed_chunks_;
    devmem_counters_.landed_bytes = landed_bytes_;
    devmem_counters_.landing_note = landing_note_;
    counters_.chunks_received.store(received_, std::memory_order_relaxed);
    counters_.bytes_received.store(received_bytes_, std::memory_order_relaxed);
    counters_.device_copies.store(devmem_counters_.gathers + stagings_ + landed_chunks_, std::memory_order_relaxed);
    counters_.host_copies.store(devmem_counters_.linear_chunks, std::memory_order_relaxed);
  }

  Parts p_;
  uint32_t tx_binding_ = 0;

  // The posts, under the post lock (PathBase::post). Lock order: io_mu_, then the post lock, then
  // stats_mu_.
  std::deque<TxSeg> tx_posts_;
  std::deque<RxItem> rx_posts_;

  // io_mu_ guards the I/O state below: held by the thread for one round, and by stop().
  std::mutex io_mu_;
  std::deque<TxSeg> tx_;
  std::deque<RxItem> rx_;
  uint64_t ring_head_ = 0;
  bool tx_blocked_ = false, peer_shut_ = false, quiesced_ = false;
  short last_revents_ = 0;
  std::optional<std::chrono::steady_clock::time_point> unclaimed_since_;
  uint64_t stagings_ = 0, received_ = 0, received_bytes_ = 0, direct_sends_ = 0, ring_sends_ = 0;
  std::optional<devmem::PlacedMemory> landing_;  // made at its first use (ensure_landing)
  Status landing_failed_;                        // why there is none, once asked
  std::optional<LandingCopy> landing_copy_;      // the zone's chunk on its way out
  CopyQueues landing_queues_;                    // those copies, by device
  uint64_t landed_chunks_ = 0, landed_bytes_ = 0;

  mutable std::mutex stats_mu_;
  std::string last_tx_note_;  // guarded by stats_mu_: where the last device chunk was sent from, and why
  std::string landing_note_;  // guarded by stats_mu_: the landing zone, once made
  DevmemPathCounters devmem_counters_;
};

}  // namespace

Result<std::unique_ptr<PayloadPath>> make_devmem_path(UniqueFd data_socket, const Config& config, std::string peer,
                                                      devmem::HostSeams seams, DevmemSteer steer) {
  auto why = [&](const Status& s, std::string_view what) {
    return Status(s.code(), fmt::format("devmem path: {}: {}", what, s.message())).with_peer(peer);
  };
  if (!data_socket.valid()) return Status(Code::kInvalidArgument, "devmem path: no data socket");
  if (!seams.netlink || !seams.exporter || !seams.socket || !seams.gatherer)
    return Status(Code::kInvalidArgument, "devmem path: incomplete seams");
  DevmemPath::Parts p;
  p.fd = std::move(data_socket);
  p.peer = peer;
  p.sock = seams.socket(p.fd.get());
  auto g = seams.gatherer();
  if (!g.ok()) return why(g.status(), "RX gatherer");
  p.gatherer = std::make_unique<SwitchGatherer>(std::move(*g));
  // The receiver first: zcrx decides which queue the data socket must be steered to.
  auto rx = devmem::open_path_rx(seams, p.fd.get(), p.sock.get(), p.gatherer.get(), config, peer);
  if (!rx.ok()) return Status(rx.status().code(), "devmem path: " + rx.status().message()).with_peer(peer);
  p.rx = std::move(rx->rx);
  p.rx_note = std::move(rx->note);
  if (steer) {
    auto s = steer(rx->queue);
    if (!s.ok()) return s.status().with_peer(peer);
    p.steering = std::move(*s);
  }
  auto ring = devmem::place_memory(seams, devmem::MemoryUse::kTxRing, kDevmemTxRing, peer);
  if (!ring.ok()) return why(ring.status(), "the TX ring");
  p.ring = std::move(*ring);
  auto txb = BoundRegion::bind_tx(*seams.netlink, seams.ifindex, p.ring.region, seams.exporter);
  if (!txb.ok()) return why(txb.status(), fmt::format("bind-tx of the TX ring to {}", seams.ifname));
  p.tx_bound = std::move(*txb);
  if (host_memory(seams.memory)) {
    p.stager = std::make_unique<Stager>(nullptr);
  } else {
    auto sg = seams.gatherer();
    if (!sg.ok()) return why(sg.status(), "TX staging gatherer");
    p.stager = std::make_unique<Stager>(std::move(*sg));
  }
  devmem::TxOptions to;
  to.ifname = seams.ifname;
  to.peer = peer;
  auto tx = DevmemTx::create(p.sock.get(), p.tx_bound->tx_info(), to);
  if (!tx.ok()) return why(tx.status(), "send side");
  p.tx = std::move(*tx);
  uint32_t tx_id = p.tx_bound->id();
  p.seams = std::move(seams);
  auto path = std::make_unique<DevmemPath>(std::move(p));
  path->set_tx_binding(tx_id);
  DMX_LOG_INFO("devmem path to {}: {}", peer, path->describe());
  return std::unique_ptr<PayloadPath>(std::move(path));
}

bool devmem_path_counters(const PayloadPath& path, DevmemPathCounters* out) {
  auto* d = dynamic_cast<const DevmemPath*>(&path);
  if (!d) return false;
  *out = d->counters();
  return true;
}

}  // namespace dmx
