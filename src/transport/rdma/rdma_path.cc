#include "transport/rdma/rdma_path.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
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
constexpr int kRegionAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;

// wr_id: the kind in the top byte, then an id (receives carry their queue pair's index).
constexpr uint64_t kWrRead = uint64_t{1} << 56, kWrNotice = uint64_t{2} << 56, kWrKind = uint64_t{0xff} << 56;

// By the wr_id: a completion with an error status has no valid opcode.
const char* wr_text(uint64_t wr_id) {
  switch (wr_id & kWrKind) {
    case kWrRead: return "RDMA READ";
    case kWrNotice: return "release notice (SEND with immediate)";
    case 0: return "receive";
    default: return "work request";
  }
}

bool host_kind(const MemSpec& m) { return m.kind == MemKind::kHost || m.kind == MemKind::kPinned; }

class RdmaPath final : public PathBase {
  struct TxChunk {
    uint64_t seq;
    std::shared_ptr<Mr> owned;  // a registration of this chunk alone; null: its region's
  };
  struct RxJob {
    uint64_t seq;
    ChunkDescriptor d;
    MemRegion dst;
  };
  struct RxOp {
    uint64_t seq;
    uint32_t token;
    uint64_t len;
    int pieces_left;
    std::shared_ptr<Mr> owned;
    std::optional<Buffer> staging;  // memory the NIC cannot reach lands here first
    MemRegion dst;                  // then is copied here
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
        sq_waiting_(conn_->qps.size()) {}

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
    std::shared_ptr<Mr> owned;
    if (src.size > 0) {
      auto mr = registration(src, IBV_ACCESS_REMOTE_READ, &owned);
      if (!mr.ok()) return mr.status().with_peer(peer_);
      d.addr = reinterpret_cast<uintptr_t>(src.ptr);
      d.rkey = (*mr)->rkey();
    }
    std::lock_guard lock(tx_mu_);
    while (tx_.count(next_token_)) ++next_token_;
    d.token = next_token_++;
    if (!open_and([&] { return tx_.emplace(d.token, TxChunk{seq, std::move(owned)}).second; })) return gate();
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
    return fmt::format("rdma {}, {} RC queue pairs, chunks <= {} B by RDMA READ; host memory by ibv_reg_mr, {}; "
                       "{} chunks registered alone, {} by their registered region",
                       device_->describe(), conn_->qps.size(), max_chunk_, gpu_.why,
                       per_chunk_.load(std::memory_order_relaxed), by_region_.load(std::memory_order_relaxed));
  }

 private:
  // The registration of [r.ptr, +r.size): its registered region's when the user registered one,
  // else one made for it alone (returned in `owned` too).
  Result<std::shared_ptr<Mr>> registration(const MemRegion& r, int access, std::shared_ptr<Mr>* owned) {
    if (regions_) {
      if (auto reg = regions_->find(r.ptr, r.size, r.where)) {
        auto mr = reg->mr_for(conn_->pd, kRegionAccess, gpu_);
        if (mr.ok()) {
          remember(reg);
          by_region_.fetch_add(1, std::memory_order_relaxed);
          return mr;
        }
      }
    }
    auto mr = register_region(conn_->pd, r, access, gpu_);
    if (!mr.ok()) return mr.status();
    per_chunk_.fetch_add(1, std::memory_order_relaxed);
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
    if (take_posts([&] { jobs.swap(jobs_); })) {
      for (RxJob& j : jobs) start_rx(j, done);
      moved = moved || !jobs.empty();
    }
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
    if (j.dst.ptr == nullptr || j.d.len == 0) {  // dropped, or nothing to read: release at once
      notice(j.d.token);
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
        notice(j.d.token);
        done->push_back({false, j.seq, b.status().with_peer(peer_)});
        return;
      }
      staging = std::move(*b);
      land = staging->region();
    }
    std::shared_ptr<Mr> owned;
    auto mr = registration(land, IBV_ACCESS_LOCAL_WRITE, &owned);
    if (!mr.ok()) {
      notice(j.d.token);
      done->push_back({false, j.seq, mr.status().with_peer(peer_)});
      return;
    }
    uint64_t remote = j.d.addr;
    uint32_t rkey = j.d.rkey;
    if (tamper_) remote += static_cast<uint64_t>(tamper_->addr_delta), rkey ^= tamper_->rkey_xor;
    const size_t nqp = conn_->qps.size();
    uint64_t piece = std::max(kMinPiece, (j.d.len + nqp - 1) / nqp);
    int pieces = static_cast<int>((j.d.len + piece - 1) / piece);
    uint64_t id = next_op_++ & ~kWrKind;
    ops_[id] = RxOp{j.seq, j.d.token, j.d.len, pieces, std::move(owned), std::move(staging), j.dst};
    for (int i = 0; i < pieces; ++i) {
      uint64_t off = static_cast<uint64_t>(i) * piece;
      uint64_t len = std::min(piece, j.d.len - off);
      Wr w{kWrRead | id, IBV_WR_RDMA_READ,
           ibv_sge{reinterpret_cast<uintptr_t>(land.ptr) + off, static_cast<uint32_t>(len), (*mr)->lkey()},
           remote + off, rkey, 0};
      queue_wr(static_cast<int>((id + static_cast<uint64_t>(i)) % nqp), w);
    }
  }

  // The release notice for `token`, on the queue pair the token picks.
  void notice(uint32_t token) {
    queue_wr(static_cast<int>(token % conn_->qps.size()),
             Wr{kWrNotice | token, IBV_WR_SEND_WITH_IMM, ibv_sge{}, 0, 0, htonl(token)});
  }

  void queue_wr(int qp, const Wr& w) {
    sq_waiting_[static_cast<size_t>(qp)].push_back(w);
    flush_qp(qp);
  }

  bool flush_waiting() {
    bool any = false;
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
      if (w.opcode == IBV_WR_RDMA_READ) {
        wr.sg_list = &w.sge;
        wr.num_sge = 1;
        wr.wr.rdma.remote_addr = w.remote_addr;
        wr.wr.rdma.rkey = w.rkey;
      } else {
        wr.imm_data = w.imm;
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

  void on_completion(const ibv_wc& wc, std::vector<Done>* done) {
    const uint64_t kind = wc.wr_id & kWrKind;
    int qp = conn_->index_of(wc.qp_num);
    if (kind != 0 && qp >= 0 && sq_inflight_[static_cast<size_t>(qp)] > 0) --sq_inflight_[static_cast<size_t>(qp)];
    if (wc.status != IBV_WC_SUCCESS) {
      if (wc.status == IBV_WC_WR_FLUSH_ERR && (failed() || stopping())) return;  // the end's flush
      fail_with(Status(Code::kIo, fmt::format("rdma: {} on queue pair {:#x} failed: {} (vendor error {:#x}){}",
                                              wr_text(wc.wr_id), wc.qp_num,
                                              ibv_wc_status_str(wc.status), wc.vendor_err,
                                              wc.status == IBV_WC_REM_ACCESS_ERR
                                                  ? ": the peer's NIC refused the rkey or address"
                                                  : wc.status == IBV_WC_RETRY_EXC_ERR ? ": the peer does not answer (died?)"
                                                                                       : ""))
                    .with_peer(peer_));
      return;
    }
    if (kind == kWrRead) {
      auto it = ops_.find(wc.wr_id & ~kWrKind);
      if (it == ops_.end() || --it->second.pieces_left > 0) return;
      RxOp op = std::move(it->second);
      ops_.erase(it);
      notice(op.token);
      Status landed;
      if (op.staging) {  // the copy engines take it the rest of the way
        landed = copy_memory(op.dst, op.staging->region());
        PathCounters::add(counters_.device_copies);
      }
      PathCounters::add(counters_.chunks_received);
      PathCounters::add(counters_.bytes_received, op.len);
      done->push_back({false, op.seq, landed.ok() ? landed : landed.with_peer(peer_)});
    } else if (kind == 0) {  // a release notice from the peer
      if (!(wc.wc_flags & IBV_WC_WITH_IMM) || wc.opcode != IBV_WC_RECV) {
        fail_with(Status(Code::kProtocol, "rdma: the peer sent a message without a token").with_peer(peer_));
        return;
      }
      uint32_t token = ntohl(wc.imm_data);
      std::shared_ptr<Mr> owned;  // deregistered outside the lock
      uint64_t seq = 0;
      {
        std::lock_guard lock(tx_mu_);
        auto it = tx_.find(token);
        if (it == tx_.end()) {
          fail_with(Status(Code::kProtocol, fmt::format("rdma: the peer released chunk token {}, which is not in flight",
                                                        token))
                        .with_peer(peer_));
          return;
        }
        seq = it->second.seq;
        owned = std::move(it->second.owned);
        tx_.erase(it);
      }
      done->push_back({true, seq, Status()});
      if (qp >= 0) {
        Status s = post_receives(conn_->qps[static_cast<size_t>(qp)], qp, 1, peer_);
        if (!s.ok()) fail_with(s);
      }
    }
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
    // The NIC first: no READ may land once this returns.
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
    take_posts([&] { left.swap(jobs_); });
    for (const RxJob& j : left) done->push_back({false, j.seq, why});
    for (auto& [_, op] : ops_) done->push_back({false, op.seq, why});
    ops_.clear();
    for (auto& q : sq_waiting_) q.clear();
    std::unordered_map<uint32_t, TxChunk> tx;
    {
      std::lock_guard lock(tx_mu_);
      tx.swap(tx_);
    }
    for (auto& [_, c] : tx) done->push_back({true, c.seq, why});
    forget_regions();
  }

  const std::shared_ptr<Device> device_;
  const std::shared_ptr<RegionTable> regions_;
  const GpuRegistration gpu_;
  const std::unique_ptr<Connection> conn_;
  const UniqueFd socket_;
  const std::string peer_;
  const RxTamper* const tamper_;
  const uint64_t max_chunk_;

  std::mutex tx_mu_;  // guards tx_, next_token_
  std::unordered_map<uint32_t, TxChunk> tx_;
  uint32_t next_token_ = 1;

  std::mutex used_mu_;  // guards used_: the registered regions this path made Mrs for
  std::map<const RegisteredRegion*, std::weak_ptr<RegisteredRegion>> used_;

  std::deque<RxJob> jobs_;  // under the post lock

  // The progress thread's own.
  std::unordered_map<uint64_t, RxOp> ops_;
  uint64_t next_op_ = 1;
  std::vector<int> sq_inflight_;
  std::vector<std::deque<Wr>> sq_waiting_;
  std::vector<ibv_wc> stash_;

  std::atomic<uint64_t> per_chunk_{0}, by_region_{0};
};

}  // namespace

std::unique_ptr<PayloadPath> make_rdma_path(PathSetup setup) { return std::make_unique<RdmaPath>(std::move(setup)); }

}  // namespace dmx::rdma
