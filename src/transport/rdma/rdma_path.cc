#include "transport/rdma/rdma_path.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "core/clock.h"
#include "core/log.h"
#include "transport/path_base.h"

namespace dmx::rdma {
namespace {

using namespace std::chrono_literals;

constexpr auto kSpin = std::chrono::microseconds(50);
constexpr auto kIdleSleep = std::chrono::milliseconds(100);  // bound on one sleep (the socket is watched too)
constexpr auto kDrain = std::chrono::seconds(5);             // flushed work after to_error(), at the end
constexpr uint64_t kMinPiece = 64 << 10;                     // stripes of a chunk over the queue pairs
constexpr int kPollBatch = 32;
// A region's registration serves as the local side only (the source of a WRITE, the landing of a
// small chunk's copy): it never grants the peer anything.
constexpr int kRegionAccess = IBV_ACCESS_LOCAL_WRITE;
constexpr uint32_t kNoSlot = 0xFFFF;

// wr_id of sends: the kind in the top byte, a send slot (kNoSlot: none) in bits 32-47, the token
// below. Receives carry their queue pair << 32 | their slot (kind 0).
constexpr uint64_t kWrWrite = uint64_t{1} << 56, kWrSend = uint64_t{2} << 56, kWrKind = uint64_t{0xff} << 56;
uint64_t send_id(uint64_t kind, uint32_t slot, uint32_t token) { return kind | uint64_t{slot} << 32 | token; }
uint32_t id_slot(uint64_t wr_id) { return static_cast<uint32_t>(wr_id >> 32) & 0xFFFF; }
uint32_t id_token(uint64_t wr_id) { return static_cast<uint32_t>(wr_id) & kMaxToken; }

// The messages on the queue pairs: SEND with immediate data = kind << 24 | token.
enum Msg : uint32_t {
  kMsgCts = 1,    // receiver -> sender: a Cts (16 B): write the chunk there
  kMsgSmall = 2,  // sender -> receiver: a small chunk's bytes
  kMsgDone = 3,   // receiver -> sender: the small chunk left its slot (the credit comes back)
};
uint32_t imm(Msg kind, uint32_t token) { return htonl(kind << 24 | token); }

// By the wr_id: a completion with an error status has no valid opcode.
const char* wr_text(uint64_t wr_id) {
  switch (wr_id & kWrKind) {
    case kWrWrite: return "RDMA WRITE with immediate";
    case kWrSend: return "SEND";
    case 0: return "receive";
    default: return "work request";
  }
}

bool host_kind(const MemSpec& m) { return m.kind == MemKind::kHost || m.kind == MemKind::kPinned; }

// The state of one chunk on each side (the lifecycle beside each):
//   sender, large:  registered -> (clear-to-send) -> WRITE pieces posted -> every piece completed: tx done
//   sender, small:  queued -> a credit and a send slot: copied and SENT: tx done; the credit is back at kMsgDone
//   receiver, large: queued -> window registered, clear-to-send SENT -> every piece's immediate: rx done
//   receiver, small: the header (post_rx) and the SEND meet in either order -> copied, slot reposted, kMsgDone: rx done
class RdmaPath final : public PathBase {
  struct TxChunk {
    uint64_t seq;
    MemRegion src;
    bool small;
    std::shared_ptr<Mr> owned;  // a large chunk's registration of this chunk alone; null: its region's
    uint32_t lkey = 0;
    int pieces_left = 0;        // WRITEs posted and not yet completed
  };
  struct RxJob {
    uint64_t seq;
    ChunkDescriptor d;
    MemRegion dst;
  };
  struct RxOp {  // a large chunk being written
    uint64_t seq;
    uint64_t len;
    int pieces_left;
    std::shared_ptr<Mr> window;     // exactly where the peer may write, for exactly this chunk
    std::optional<Buffer> staging;  // memory the NIC cannot reach lands here first
    MemRegion dst;                  // then is copied here
  };
  struct Held {  // a small chunk in its receive slot, waiting for its header
    int qp;
    uint32_t slot;
    uint32_t len;
  };
  struct Wr {
    uint64_t id;
    ibv_wr_opcode opcode;
    ibv_sge sge;
    uint64_t remote_addr;
    uint32_t rkey;
    uint32_t imm;
  };

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
  bool carries(const MemSpec& m) const override {
    return host_kind(m) || gpu_.direct(m);
  }
  // Every destination: memory the NIC cannot register (GPU memory without dma-buf or peer memory,
  // or the advisor's staging) lands in a host buffer first and is copied by the copy engines.
  bool accepts(const MemSpec&) const override { return true; }
  bool accepts_any() const override { return true; }
  uint64_t max_chunk() const override { return max_chunk_; }
  bool receiver_releases() const override { return false; }

  Result<std::vector<unsigned char>> post_tx(uint64_t seq, const MemRegion& src, bool) override {
    if (stopping() || failed()) return gate();
    if (!carries(src.where))
      return Status(Code::kUnavailable, fmt::format("rdma does not carry {} memory ({})", to_string(src.where), gpu_.why))
          .with_peer(peer_);
    if (src.size > max_chunk_)
      return Status(Code::kInvalidArgument, fmt::format("rdma chunk of {} B is over the path's {} B", src.size, max_chunk_));
    ChunkDescriptor d;
    d.len = src.size;
    // Small chunks of host memory go by SEND (copied into a send slot); GPU memory always by WRITE.
    d.small = src.size <= kSmallMax && host_kind(src.where);
    TxChunk c{seq, src, d.small, nullptr};
    if (!d.small) {
      auto mr = registration(src, 0, &c.owned);  // local access only: the peer gets no key to it
      if (!mr.ok()) return mr.status().with_peer(peer_);
      c.lkey = (*mr)->lkey();
    }
    {
      std::lock_guard lock(tx_mu_);
      for (int tries = 0; tx_.count(next_token_) || next_token_ == 0; ++tries) {
        next_token_ = (next_token_ + 1) & kMaxToken;
        if (tries > static_cast<int>(kMaxToken)) return Status(Code::kResourceExhausted, "rdma: no free chunk token");
      }
      d.token = next_token_;
      next_token_ = (next_token_ + 1) & kMaxToken;
      tx_.emplace(d.token, std::move(c));
    }
    if (d.small) {
      Status s = post([&] { small_tx_.push_back(d.token); });
      if (!s.ok()) {
        std::lock_guard lock(tx_mu_);
        tx_.erase(d.token);
        return s;
      }
    } else if (!open_and([] { return true; })) {
      std::lock_guard lock(tx_mu_);
      tx_.erase(d.token);
      return gate();
    }
    PathCounters::add(counters_.chunks_sent);
    PathCounters::add(counters_.bytes_sent, src.size);
    return d.encode();
  }

  Result<uint64_t> chunk_length(std::span<const unsigned char> descriptor) override {
    DMX_ASSIGN_OR_RETURN(ChunkDescriptor d, ChunkDescriptor::decode(descriptor, max_chunk_, peer_));
    return d.len;
  }

  Status post_rx(uint64_t seq, std::span<const unsigned char> descriptor, const MemRegion& dst) override {
    DMX_ASSIGN_OR_RETURN(ChunkDescriptor d, ChunkDescriptor::decode(descriptor, max_chunk_, peer_));
    if (dst.ptr != nullptr && dst.size != d.len)
      return Status(Code::kInvalidArgument, fmt::format("rdma chunk of {} B into {} B", d.len, dst.size));
    if (dst.ptr != nullptr && !accepts(dst.where))
      return Status(Code::kInvalidArgument, fmt::format("rdma cannot land in {} memory", to_string(dst.where)));
    return post([&] { jobs_.push_back(RxJob{seq, d, dst}); });
  }

  std::string describe() const override {
    return fmt::format("rdma {}, {} RC queue pairs, chunks <= {} B by RDMA WRITE with immediate, <= {} B by SEND "
                       "({} in flight per queue pair); host memory by ibv_reg_mr, {}; "
                       "{} chunks registered alone, {} by their registered region",
                       device_->describe(), conn_->qps.size(), max_chunk_, kSmallMax, conn_->theirs.credits, gpu_.why,
                       per_chunk_.load(std::memory_order_relaxed), by_region_.load(std::memory_order_relaxed));
  }

 private:
  // The registration of [r.ptr, +r.size): its registered region's when the user registered one and
  // `access` asks nothing remote, else one made for it alone (returned in `owned` too).
  Result<std::shared_ptr<Mr>> registration(const MemRegion& r, int access, std::shared_ptr<Mr>* owned) {
    std::shared_ptr<RegisteredRegion> reg;
    if (regions_) reg = regions_->find(r.ptr, r.size, r.where);
    if (reg && (access & ~kRegionAccess) == 0) {
      auto mr = reg->mr_for(conn_->pd, kRegionAccess, gpu_);
      if (mr.ok()) {
        remember(reg);
        by_region_.fetch_add(1, std::memory_order_relaxed);
        return mr;
      }
    }
    auto mr = register_region(conn_->pd, r, access, gpu_);
    if (!mr.ok()) return mr.status();
    per_chunk_.fetch_add(1, std::memory_order_relaxed);
    // A window inside a registered region dies with the region, even while a WRITE is on its way.
    if (reg) reg->track(*mr);
    *owned = *mr;
    return mr;
  }

  void remember(const std::shared_ptr<RegisteredRegion>& reg) {
    std::lock_guard lock(used_mu_);
    std::erase_if(used_, [](const auto& kv) { return kv.second.expired(); });
    used_.emplace(reg.get(), reg);
  }
  void forget_regions() {
    std::map<const RegisteredRegion*, std::weak_ptr<RegisteredRegion>> used;
    {
      std::lock_guard lock(used_mu_);
      used.swap(used_);
    }
    for (auto& [_, w] : used)
      if (auto reg = w.lock()) reg->forget(conn_->pd.get());
  }

  // ---- the progress thread ----
  bool progress(std::vector<Done>* done) override {
    bool moved = false;
    std::deque<RxJob> jobs;
    std::deque<uint32_t> small;
    if (take_posts([&] {
          jobs.swap(jobs_);
          small.swap(small_tx_);
        })) {
      for (RxJob& j : jobs) start_rx(j, done);
      for (uint32_t t : small) small_waiting_.push_back(t);
      moved = moved || !jobs.empty() || !small.empty();
    }
    moved = send_small(done) || moved;
    if (!pending_writes_.empty()) post_writes();
    moved = flush_waiting() || moved;
    std::vector<ibv_wc> wcs;
    wcs.swap(stash_);
    ibv_wc batch[kPollBatch];
    int n = ibv_poll_cq(conn_->cq, kPollBatch, batch);
    if (n < 0) {
      fail_with(Status(Code::kIo, "rdma: ibv_poll_cq failed").with_peer(peer_));
      return true;
    }
    wcs.insert(wcs.end(), batch, batch + n);
    for (const ibv_wc& wc : wcs) {
      on_completion(wc, done);
      if (failed()) break;
    }
    return moved || !wcs.empty();
  }

  void start_rx(const RxJob& j, std::vector<Done>* done) {
    if (j.d.small) {
      if (auto h = held_.find(j.d.token); h != held_.end()) {
        Held held = h->second;
        held_.erase(h);
        land_small(j, held, done);
      } else if (!small_rx_.emplace(j.d.token, j).second) {
        fail_with(Status(Code::kProtocol, fmt::format("rdma: the peer sent small chunk token {} twice", j.d.token))
                      .with_peer(peer_));
      }
      return;
    }
    if (j.dst.ptr == nullptr || j.d.len == 0) {  // dropped, or nothing to write: the sender lets go at once
      cts(j.d.token, Cts{0, 0, true});
      done->push_back({false, j.seq, Status()});
      return;
    }
    // Where the NIC writes: the destination, or a staging buffer when it cannot reach it.
    MemRegion land = j.dst;
    std::optional<Buffer> staging;
    if (!carries(j.dst.where)) {
      auto b = Buffer::allocate(MemSpec{MemKind::kPinned, 0}, j.d.len);
      if (!b.ok()) b = Buffer::allocate(MemSpec{}, j.d.len);
      if (!b.ok()) {
        cts(j.d.token, Cts{0, 0, true});
        done->push_back({false, j.seq, b.status().with_peer(peer_)});
        return;
      }
      staging = std::move(*b);
      land = staging->region();
    }
    // Exactly this chunk, for exactly its life: the peer's only key to our memory.
    std::shared_ptr<Mr> window;
    auto mr = registration(land, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, &window);
    if (!mr.ok()) {
      cts(j.d.token, Cts{0, 0, true});
      done->push_back({false, j.seq, mr.status().with_peer(peer_)});
      return;
    }
    if (rx_.count(j.d.token)) {
      fail_with(Status(Code::kProtocol, fmt::format("rdma: the peer sent chunk token {} twice", j.d.token)).with_peer(peer_));
      return;
    }
    rx_[j.d.token] = RxOp{j.seq, j.d.len, pieces(j.d.len), window, std::move(staging), j.dst};
    cts(j.d.token, Cts{reinterpret_cast<uintptr_t>(land.ptr), window->rkey(), false});
  }

  // How many WRITEs a chunk of `len` bytes is striped into (both sides count alike).
  int pieces(uint64_t len) const { return static_cast<int>((len + piece_size(len) - 1) / piece_size(len)); }
  uint64_t piece_size(uint64_t len) const {
    const uint64_t nqp = conn_->qps.size();
    return std::max(kMinPiece, (len + nqp - 1) / nqp);
  }

  // A small chunk's bytes met its header: into the destination, the slot back to the NIC, and the
  // credit back to the sender.
  void land_small(const RxJob& j, const Held& h, std::vector<Done>* done) {
    Status s;
    if (h.len != j.d.len) {
      s = Status(Code::kProtocol, fmt::format("rdma: small chunk token {} is {} B, its header said {} B", j.d.token,
                                              h.len, j.d.len))
              .with_peer(peer_);
    } else if (j.dst.ptr != nullptr && h.len > 0) {
      const unsigned char* from = conn_->recv_slot(h.qp, h.slot);
      if (host_kind(j.dst.where)) {
        std::memcpy(j.dst.ptr, from, h.len);
        PathCounters::add(counters_.host_copies);
      } else {
        s = copy_memory(j.dst, MemRegion{const_cast<unsigned char*>(from), h.len, MemSpec{}});
        PathCounters::add(counters_.device_copies);
      }
    }
    --held_per_qp_[static_cast<size_t>(h.qp)];
    repost(h.qp, h.slot);
    queue_wr(h.qp, Wr{send_id(kWrSend, kNoSlot, j.d.token), IBV_WR_SEND_WITH_IMM, ibv_sge{}, 0, 0, imm(kMsgDone, j.d.token)});
    PathCounters::add(counters_.chunks_received);
    PathCounters::add(counters_.bytes_received, h.len);
    done->push_back({false, j.seq, s});
    if (!s.ok()) fail_with(s);
  }

  // Small chunks waiting for a credit and a send slot, in order.
  bool send_small(std::vector<Done>* done) {
    bool any = false;
    while (!small_waiting_.empty() && !free_slots_.empty() && !failed()) {
      const size_t nqp = conn_->qps.size();
      int qp = -1;
      for (size_t k = 0; k < nqp; ++k) {
        size_t q = (next_small_qp_ + k) % nqp;
        if (credits_[q] > 0 || (tamper_ && tamper_->ignore_credits)) {
          qp = static_cast<int>(q);
          break;
        }
      }
      if (qp < 0) break;  // the peer has all our credits: backpressure until its kMsgDone
      next_small_qp_ = (static_cast<size_t>(qp) + 1) % nqp;
      uint32_t token = small_waiting_.front();
      small_waiting_.pop_front();
      uint64_t seq = 0;
      uint64_t len = 0;
      uint32_t slot = free_slots_.front();
      {
        std::lock_guard lock(tx_mu_);
        auto it = tx_.find(token);
        if (it == tx_.end()) continue;  // completed by the end already
        seq = it->second.seq;
        len = it->second.src.size;
        if (len > 0) std::memcpy(conn_->send_slot(slot), it->second.src.ptr, len);
        tx_.erase(it);
      }
      free_slots_.pop_front();
      --credits_[static_cast<size_t>(qp)];
      small_inflight_[token] = qp;
      queue_wr(qp, Wr{send_id(kWrSend, slot, token), IBV_WR_SEND_WITH_IMM,
                      ibv_sge{reinterpret_cast<uintptr_t>(conn_->send_slot(slot)), static_cast<uint32_t>(len),
                              conn_->slots_mr->lkey()},
                      0, 0, imm(kMsgSmall, token)});
      done->push_back({true, seq, Status()});  // copied: the source is free
      any = true;
    }
    return any;
  }

  // The receiver's clear-to-send (or drop) for `token`, in a send slot.
  void cts(uint32_t token, const Cts& c) {
    if (free_slots_.empty()) {  // every slot is on the wire: wait for one (bounded by the send queues)
      cts_waiting_.push_back({token, c});
      return;
    }
    uint32_t slot = free_slots_.front();
    free_slots_.pop_front();
    std::vector<unsigned char> b = c.encode();
    std::memcpy(conn_->send_slot(slot), b.data(), b.size());
    queue_wr(static_cast<int>(token % conn_->qps.size()),
             Wr{send_id(kWrSend, slot, token), IBV_WR_SEND_WITH_IMM,
                ibv_sge{reinterpret_cast<uintptr_t>(conn_->send_slot(slot)), static_cast<uint32_t>(b.size()),
                        conn_->slots_mr->lkey()},
                0, 0, imm(kMsgCts, token)});
  }

  void queue_wr(int qp, const Wr& w) {
    sq_waiting_[static_cast<size_t>(qp)].push_back(w);
    flush_qp(qp);
  }

  bool flush_waiting() {
    bool any = false;
    while (!cts_waiting_.empty() && !free_slots_.empty()) {
      auto [token, c] = cts_waiting_.front();
      cts_waiting_.pop_front();
      cts(token, c);
      any = true;
    }
    for (size_t q = 0; q < sq_waiting_.size(); ++q) any = flush_qp(static_cast<int>(q)) || any;
    return any;
  }

  bool flush_qp(int qp) {
    auto& waiting = sq_waiting_[static_cast<size_t>(qp)];
    bool any = false;
    while (!waiting.empty() && sq_inflight_[static_cast<size_t>(qp)] < conn_->depths.send && !failed()) {
      Wr& w = waiting.front();
      ibv_send_wr wr{};
      ibv_send_wr* bad = nullptr;
      wr.wr_id = w.id;
      wr.opcode = w.opcode;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.imm_data = w.imm;
      if (w.sge.length > 0) {
        wr.sg_list = &w.sge;
        wr.num_sge = 1;
      }
      if (w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
        wr.wr.rdma.remote_addr = w.remote_addr;
        wr.wr.rdma.rkey = w.rkey;
      }
      if (int err = ibv_post_send(conn_->qps[static_cast<size_t>(qp)], &wr, &bad); err) {
        fail_with(Status(Code::kIo, fmt::format("rdma: ibv_post_send on queue pair {:#x} failed: {}",
                                                conn_->qps[static_cast<size_t>(qp)]->qp_num, errno_text(err)))
                      .with_peer(peer_));
        return true;
      }
      ++sq_inflight_[static_cast<size_t>(qp)];
      waiting.pop_front();
      any = true;
    }
    return any;
  }

  void repost(int qp, uint32_t slot) {
    Status s = conn_->post_slot(qp, slot, peer_);
    if (!s.ok()) fail_with(s);
  }

  void protocol(std::string what) { fail_with(Status(Code::kProtocol, "rdma: " + what).with_peer(peer_)); }

  void on_completion(const ibv_wc& wc, std::vector<Done>* done) {
    const uint64_t kind = wc.wr_id & kWrKind;
    int qp = conn_->index_of(wc.qp_num);
    if (kind != 0 && qp >= 0 && sq_inflight_[static_cast<size_t>(qp)] > 0) --sq_inflight_[static_cast<size_t>(qp)];
    if (kind == kWrSend && id_slot(wc.wr_id) != kNoSlot) free_slots_.push_back(id_slot(wc.wr_id));
    if (wc.status != IBV_WC_SUCCESS) {
      if (wc.status == IBV_WC_WR_FLUSH_ERR && (failed() || stopping())) return;  // the end's flush
      const char* hint = "";
      if (wc.status == IBV_WC_REM_ACCESS_ERR)
        hint = kind == 0 ? ": the peer wrote with a key or at an address outside the window we gave"
                         : ": the peer's NIC refused the rkey or address";
      else if (wc.status == IBV_WC_RETRY_EXC_ERR)
        hint = ": the peer does not answer (died?)";
      fail_with(Status(Code::kIo, fmt::format("rdma: {} on queue pair {:#x} failed: {} (vendor error {:#x}){}",
                                              wr_text(wc.wr_id), wc.qp_num, ibv_wc_status_str(wc.status),
                                              wc.vendor_err, hint))
                    .with_peer(peer_));
      return;
    }
    if (kind == kWrWrite) {
      std::shared_ptr<Mr> owned;  // deregistered outside the lock
      uint64_t seq = 0;
      {
        std::lock_guard lock(tx_mu_);
        auto it = tx_.find(id_token(wc.wr_id));
        if (it == tx_.end() || --it->second.pieces_left > 0) return;
        seq = it->second.seq;
        owned = std::move(it->second.owned);
        tx_.erase(it);
      }
      done->push_back({true, seq, Status()});  // RC: every piece is in the peer's memory
      return;
    }
    if (kind != 0 || qp < 0) return;
    const uint32_t slot = static_cast<uint32_t>(wc.wr_id);
    if (!(wc.wc_flags & IBV_WC_WITH_IMM)) return protocol("the peer sent a message without immediate data");
    const uint32_t word = ntohl(wc.imm_data);
    if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
      repost(qp, slot);
      return on_written(word, done);
    }
    const uint32_t token = word & kMaxToken;
    switch (word >> 24) {
      case kMsgCts: {
        std::span<const unsigned char> body(conn_->recv_slot(qp, slot), std::min<size_t>(wc.byte_len, kSmallMax));
        std::vector<unsigned char> copy(body.begin(), body.end());
        repost(qp, slot);
        return on_cts(token, copy, done);
      }
      case kMsgSmall: {
        if (held_per_qp_[static_cast<size_t>(qp)] >= conn_->mine.credits)
          return protocol(fmt::format("the peer sent more small chunks on queue pair {} than its {} credits (a flood)",
                                      qp, conn_->mine.credits));
        ++held_per_qp_[static_cast<size_t>(qp)];
        Held h{qp, slot, wc.byte_len};
        if (auto it = small_rx_.find(token); it != small_rx_.end()) {
          RxJob j = it->second;
          small_rx_.erase(it);
          return land_small(j, h, done);
        }
        if (!held_.emplace(token, h).second) return protocol(fmt::format("small chunk token {} came twice", token));
        return;
      }
      case kMsgDone: {
        repost(qp, slot);
        auto it = small_inflight_.find(token);
        if (it == small_inflight_.end())
          return protocol(fmt::format("the peer released small chunk token {}, which is not in flight", token));
        ++credits_[static_cast<size_t>(it->second)];
        small_inflight_.erase(it);
        return;
      }
      default:
        return protocol(fmt::format("message kind {} (immediate {:#x})", word >> 24, word));
    }
  }

  // The sender: the receiver's clear-to-send for a large chunk.
  void on_cts(uint32_t token, std::span<const unsigned char> body, std::vector<Done>* done) {
    uint64_t seq = 0, len = 0;
    uintptr_t src = 0;
    uint32_t lkey = 0;
    std::shared_ptr<Mr> owned;
    {
      std::lock_guard lock(tx_mu_);
      auto it = tx_.find(token);
      if (it == tx_.end() || it->second.small || it->second.pieces_left > 0)
        return protocol(fmt::format("a clear-to-send for chunk token {}, which awaits none", token));
      auto c = Cts::decode(body, it->second.src.size, peer_);
      if (!c.ok()) return fail_with(c.status());
      seq = it->second.seq;
      len = it->second.src.size;
      if (c->drop || len == 0) {
        owned = std::move(it->second.owned);
        tx_.erase(it);
        done->push_back({true, seq, Status()});
        return;
      }
      src = reinterpret_cast<uintptr_t>(it->second.src.ptr);
      lkey = it->second.lkey;
      it->second.pieces_left = pieces(len);
      uint64_t remote = c->addr;
      uint32_t rkey = c->rkey;
      if (tamper_) remote += static_cast<uint64_t>(tamper_->addr_delta), rkey ^= tamper_->rkey_xor;
      pending_writes_.push_back({token, src, len, lkey, remote, rkey});
    }
    post_writes();
  }

  void post_writes() {
    if (tamper_ && tamper_->hold && tamper_->hold->load()) return;
    for (const auto& w : pending_writes_) {
      const uint64_t piece = piece_size(w.len);
      const int n = pieces(w.len);
      const size_t nqp = conn_->qps.size();
      for (int i = 0; i < n; ++i) {
        uint64_t off = static_cast<uint64_t>(i) * piece;
        uint64_t len = std::min(piece, w.len - off);
        queue_wr(static_cast<int>((w.token + static_cast<uint64_t>(i)) % nqp),
                 Wr{send_id(kWrWrite, kNoSlot, w.token), IBV_WR_RDMA_WRITE_WITH_IMM,
                    ibv_sge{w.src + off, static_cast<uint32_t>(len), w.lkey}, w.remote + off, w.rkey, htonl(w.token)});
      }
    }
    pending_writes_.clear();
  }

  // The receiver: one piece of a large chunk is in place.
  void on_written(uint32_t word, std::vector<Done>* done) {
    const uint32_t token = word;
    auto it = rx_.find(token);
    if (it == rx_.end() || word > kMaxToken)
      return protocol(fmt::format("the peer wrote chunk token {:#x}, which is not in flight", word));
    if (--it->second.pieces_left > 0) return;
    RxOp op = std::move(it->second);
    rx_.erase(it);
    op.window.reset();  // its rkey dies now
    Status landed;
    if (op.staging) {  // the copy engines take it the rest of the way
      landed = copy_memory(op.dst, op.staging->region());
      PathCounters::add(counters_.device_copies);
    }
    PathCounters::add(counters_.chunks_received);
    PathCounters::add(counters_.bytes_received, op.len);
    done->push_back({false, op.seq, landed.ok() ? landed : landed.with_peer(peer_)});
  }

  void fail_with(Status s) {
    if (!failed() && !stopping()) DMX_LOG_WARN("{}", s.to_string());
    fail(std::move(s));
  }

  bool idle() override {
    if (ibv_req_notify_cq(conn_->cq, 0) != 0) {
      fail_with(Status(Code::kIo, "rdma: ibv_req_notify_cq failed").with_peer(peer_));
      return true;
    }
    // What completed before the CQ was armed raises no event: look once more.
    ibv_wc batch[kPollBatch];
    int n = ibv_poll_cq(conn_->cq, kPollBatch, batch);
    if (n > 0) {
      stash_.insert(stash_.end(), batch, batch + n);
      return true;
    }
    pollfd fds[2] = {{conn_->channel->fd, POLLIN, 0}, {socket_.get(), POLLIN, 0}};
    bool woke = sleep_on(std::span<pollfd>(fds, socket_.valid() ? 2 : 1), kIdleSleep);
    if (fds[0].revents & POLLIN) {
      ibv_cq* cq = nullptr;
      void* ctx = nullptr;
      if (ibv_get_cq_event(conn_->channel, &cq, &ctx) == 0) ibv_ack_cq_events(cq, 1);
    }
    if (socket_.valid() && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      char c;
      ssize_t r = ::recv(socket_.get(), &c, 1, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
        fail_with(Status(Code::kPeerFailed, "rdma: the peer's data socket closed (the peer died or ended the endpoint)")
                      .with_peer(peer_));
      else if (r > 0)
        fail_with(Status(Code::kProtocol, "rdma: the peer wrote on the data socket after the set-up").with_peer(peer_));
    }
    return woke;
  }

  void release(const Status& why, std::vector<Done>* done) override {
    // The NIC first: no WRITE may land once this returns.
    conn_->to_error();
    auto outstanding = [&] {
      int n = 0;
      for (int c : sq_inflight_) n += c;
      return n;
    };
    Deadline d = Deadline::after(kDrain);
    while (outstanding() > 0 && !d.expired()) {
      ibv_wc batch[kPollBatch];
      int n = ibv_poll_cq(conn_->cq, kPollBatch, batch);
      if (n < 0) break;
      for (int i = 0; i < n; ++i) {
        int qp = conn_->index_of(batch[i].qp_num);
        if ((batch[i].wr_id & kWrKind) != 0 && qp >= 0 && sq_inflight_[static_cast<size_t>(qp)] > 0)
          --sq_inflight_[static_cast<size_t>(qp)];
      }
      if (n == 0) std::this_thread::sleep_for(100us);
    }
    DMX_LOG_DEBUG("rdma to {}: {} work requests left after the drain", peer_, outstanding());
    if (outstanding() > 0)
      DMX_LOG_WARN("rdma: {} work requests to {} not flushed after {} s; destroying the queue pairs", outstanding(),
                   peer_, kDrain.count());
    conn_->destroy_qps();
    DMX_LOG_DEBUG("rdma to {}: queue pairs destroyed", peer_);
    std::deque<RxJob> left;
    take_posts([&] {
      left.swap(jobs_);
      small_tx_.clear();  // their chunks are in tx_
    });
    for (const RxJob& j : left) done->push_back({false, j.seq, why});
    for (auto& [_, j] : small_rx_) done->push_back({false, j.seq, why});
    small_rx_.clear();
    held_.clear();
    for (auto& [_, op] : rx_) done->push_back({false, op.seq, why});
    rx_.clear();
    for (auto& q : sq_waiting_) q.clear();
    small_waiting_.clear();
    cts_waiting_.clear();
    pending_writes_.clear();
    std::unordered_map<uint32_t, TxChunk> tx;
    {
      std::lock_guard lock(tx_mu_);
      tx.swap(tx_);
    }
    for (auto& [_, c] : tx) done->push_back({true, c.seq, why});
    forget_regions();
  }

  struct PendingWrite {
    uint32_t token;
    uintptr_t src;
    uint64_t len;
    uint32_t lkey;
    uint64_t remote;
    uint32_t rkey;
  };

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

  std::deque<RxJob> jobs_;        // under the post lock
  std::deque<uint32_t> small_tx_;  // under the post lock: small chunks posted (their tokens)

  // The progress thread's own.
  std::unordered_map<uint32_t, RxOp> rx_;         // large chunks being written, by token
  std::unordered_map<uint32_t, RxJob> small_rx_;  // small chunks whose header came first
  std::unordered_map<uint32_t, Held> held_;       // small chunks whose bytes came first (in their slots)
  std::unordered_map<uint32_t, int> small_inflight_;  // sent small chunks awaiting kMsgDone: their queue pair
  std::deque<uint32_t> small_waiting_;            // small chunks waiting for a credit or a slot
  std::deque<std::pair<uint32_t, Cts>> cts_waiting_;
  std::vector<PendingWrite> pending_writes_;
  std::vector<int> sq_inflight_;
  std::vector<std::deque<Wr>> sq_waiting_;
  std::vector<int> credits_;       // small chunks we may still send per queue pair
  std::vector<int> held_per_qp_;   // the peer's small chunks in our slots per queue pair
  std::deque<uint32_t> free_slots_;
  size_t next_small_qp_ = 0;
  std::vector<ibv_wc> stash_;

  std::atomic<uint64_t> per_chunk_{0}, by_region_{0};
};

}  // namespace

std::unique_ptr<PayloadPath> make_rdma_path(PathSetup setup) { return std::make_unique<RdmaPath>(std::move(setup)); }

}  // namespace dmx::rdma
