#include "transport/rdma/rdma_path.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "core/log.h"
#include "memory/backend.h"
#include "transport/rdma/rdma_path_impl.h"

namespace dmx::rdma {
namespace path_impl {

using namespace std::chrono_literals;

Result<std::vector<unsigned char>> RdmaPath::post_tx(uint64_t seq, const MemRegion& src, bool) {
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
  TxChunk c{seq, src, d.small};
  if (!d.small && src.size > 0) {
    std::shared_ptr<Mr> owned;
    auto mr = registration(src, 0, &owned);  // local access only: the peer gets no key to it
    if (!mr.ok()) return mr.status().with_peer(peer_);
    if (owned) c.owned.push_back(std::move(owned));
    c.from.push_back(ibv_sge{reinterpret_cast<uintptr_t>(src.ptr), static_cast<uint32_t>(src.size), (*mr)->lkey()});
  }
  return add_tx(std::move(c));
}

Result<std::vector<unsigned char>> RdmaPath::post_tx_list(uint64_t seq, std::span<const MemRegion> srcs,
                                                          size_t* taken) {
  if (stopping() || failed()) return gate();
  if (srcs.empty() || !carries(srcs[0].where))
    return Status(Code::kUnavailable, fmt::format("rdma does not carry {} memory ({})",
                                                  srcs.empty() ? "no" : to_string(srcs[0].where), gpu_.why))
        .with_peer(peer_);
  // The pieces of one kind, within a chunk, gathered by the WRITEs.
  TxChunk c{seq, MemRegion{srcs[0].ptr, 0, srcs[0].where}, false};
  size_t n = 0;
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (; n < srcs.size() && n < kRdmaMaxList; ++n) {
    const MemRegion& r = srcs[n];
    if (r.where != srcs[0].where || r.size > max_chunk_ - c.src.size) break;
    c.src.size += r.size;
    if (r.size == 0) continue;
    lo = std::min(lo, reinterpret_cast<uintptr_t>(r.ptr));
    hi = std::max(hi, reinterpret_cast<uintptr_t>(r.ptr) + r.size);
  }
  if (n == 0)
    return Status(Code::kInvalidArgument,
                  fmt::format("rdma list piece of {} B is over the path's {} B", srcs[0].size, max_chunk_));
  // Registered for local access only. Memory the user did not register: one registration of the
  // span that holds the pieces when it is not too large (a paged cache's blocks lie in one
  // allocation), instead of one a piece; else (or when that fails: a hole in the span) each piece
  // alone, or a lookup each when the user registered its region.
  std::shared_ptr<Mr> span;
  if (c.src.size > 0 && hi - lo <= kListSpanMax && !(regions_ && regions_->find(srcs[0].ptr, 1, srcs[0].where))) {
    std::shared_ptr<Mr> owned;
    auto mr = registration(MemRegion{reinterpret_cast<void*>(lo), hi - lo, srcs[0].where}, 0, &owned);
    if (mr.ok()) span = *mr;
    if (owned) c.owned.push_back(std::move(owned));
  }
  for (size_t k = 0; k < n; ++k) {
    const MemRegion& r = srcs[k];
    if (r.size == 0) continue;
    std::shared_ptr<Mr> mr = span;
    if (!mr) {
      std::shared_ptr<Mr> owned;
      auto one = registration(r, 0, &owned);
      if (!one.ok()) {
        if (k == 0) return one.status().with_peer(peer_);
        n = k;  // the pieces before it go; this one fails on its own in the next chunk
        c.src.size = 0;
        for (const ibv_sge& g : c.from) c.src.size += g.length;
        break;
      }
      if (owned) c.owned.push_back(std::move(owned));
      mr = *one;
    }
    c.from.push_back(ibv_sge{reinterpret_cast<uintptr_t>(r.ptr), static_cast<uint32_t>(r.size), mr->lkey()});
  }
  auto d = add_tx(std::move(c));
  if (d.ok()) *taken = n;
  return d;
}

Result<std::vector<unsigned char>> RdmaPath::add_tx(TxChunk c) {
  ChunkDescriptor d;
  d.len = c.src.size;
  d.small = c.small;
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
  PathCounters::add(counters_.bytes_sent, d.len);
  return d.encode();
}

Result<uint64_t> RdmaPath::chunk_length(std::span<const unsigned char> descriptor) {
  DMX_ASSIGN_OR_RETURN(ChunkDescriptor d, ChunkDescriptor::decode(descriptor, max_chunk_, peer_));
  return d.len;
}

Status RdmaPath::post_rx(uint64_t seq, std::span<const unsigned char> descriptor, const MemRegion& dst) {
  DMX_ASSIGN_OR_RETURN(ChunkDescriptor d, ChunkDescriptor::decode(descriptor, max_chunk_, peer_));
  if (dst.ptr != nullptr && dst.size != d.len)
    return Status(Code::kInvalidArgument, fmt::format("rdma chunk of {} B into {} B", d.len, dst.size));
  if (dst.ptr != nullptr && !accepts(dst.where))
    return Status(Code::kInvalidArgument, fmt::format("rdma cannot land in {} memory", to_string(dst.where)));
  return post([&] { jobs_.push_back(RxJob{seq, d, dst}); });
}

Status RdmaPath::post_rx_list(uint64_t seq, std::span<const unsigned char> descriptor,
                              std::span<const MemRegion> dsts) {
  DMX_ASSIGN_OR_RETURN(ChunkDescriptor d, ChunkDescriptor::decode(descriptor, max_chunk_, peer_));
  if (d.small)
    return Status(Code::kProtocol, fmt::format("rdma: a list of {} B announced by SEND", d.len)).with_peer(peer_);
  if (dsts.empty() || dsts.size() > kRdmaMaxList)
    return Status(Code::kProtocol, fmt::format("rdma: a list of {} pieces", dsts.size())).with_peer(peer_);
  const bool drop = dsts[0].ptr == nullptr;
  uint64_t sum = 0;
  for (const MemRegion& r : dsts) {
    if ((r.ptr == nullptr) != drop)
      return Status(Code::kInvalidArgument, "rdma post_rx_list: a list with some destinations null");
    if (r.size > d.len - sum)  // within the descriptor's length, which is bounded
      return Status(Code::kProtocol, fmt::format("rdma: a list descriptor of {} B for more bytes of pieces", d.len))
          .with_peer(peer_);
    sum += r.size;
  }
  if (sum != d.len)
    return Status(Code::kProtocol, fmt::format("rdma: a list descriptor of {} B for pieces of {} B", d.len, sum))
        .with_peer(peer_);
  RxJob j{seq, d, MemRegion{dsts[0].ptr, d.len, dsts[0].where}, {}};
  if (!drop) j.pieces.assign(dsts.begin(), dsts.end());
  return post([&] { jobs_.push_back(std::move(j)); });
}

std::string RdmaPath::describe() const {
  return fmt::format("rdma {}, {} RC queue pairs, chunks <= {} B by RDMA WRITE with immediate, <= {} B by SEND "
                     "({} in flight per queue pair), lists of <= {} pieces gathered into a staging window; "
                     "host memory by ibv_reg_mr, {}; {} chunks registered alone, {} by their registered region",
                     device_->describe(), conn_->qps.size(), max_chunk_, kSmallMax, conn_->theirs.credits,
                     kRdmaMaxList, gpu_.why, per_chunk_.load(std::memory_order_relaxed),
                     by_region_.load(std::memory_order_relaxed));
}

// The registration of [r.ptr, +r.size): its registered region's when the user registered one and
// `access` asks nothing remote, else one made for it alone (returned in `owned` too).
Result<std::shared_ptr<Mr>> RdmaPath::registration(const MemRegion& r, int access, std::shared_ptr<Mr>* owned) {
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

void RdmaPath::remember(const std::shared_ptr<RegisteredRegion>& reg) {
  std::lock_guard lock(used_mu_);
  std::erase_if(used_, [](const auto& kv) { return kv.second.expired(); });
  used_.emplace(reg.get(), reg);
}

void RdmaPath::forget_regions() {
  std::map<const RegisteredRegion*, std::weak_ptr<RegisteredRegion>> used;
  {
    std::lock_guard lock(used_mu_);
    used.swap(used_);
  }
  for (auto& [_, w] : used)
    if (auto reg = w.lock()) reg->forget(conn_->pd.get());
}

// ---- the progress thread ----
bool RdmaPath::progress(std::vector<Done>* done) {
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

void RdmaPath::start_rx(const RxJob& j, std::vector<Done>* done, bool admitted) {
  if (j.d.small) return start_small_rx(j, done);
  if (j.dst.ptr == nullptr || j.d.len == 0) {  // dropped, or nothing to write: the sender lets go at once
    cts(j.d.token, Cts{0, 0, true});
    done->push_back({false, j.seq, Status()});
    return;
  }
  // Where the NIC writes: the destination, or a staging buffer when it cannot reach it or the
  // chunk is a list (rdma_path.h).
  MemRegion land = j.dst;
  std::optional<Buffer> staged;
  if (!j.pieces.empty() || !carries(j.dst.where)) {
    // The peer decides how many chunks we stage at once: bounded, the rest wait their turn, in
    // order (a chunk larger than the bound waits for none in flight, and for nothing else).
    if (!admitted && (!staged_waiting_.empty() || !staging_room(j.d.len))) {
      staged_waiting_.push_back(j);
      return;
    }
    auto b = staging(j.d.len);
    if (!b.ok()) {
      cts(j.d.token, Cts{0, 0, true});
      done->push_back({false, j.seq, b.status().with_peer(peer_)});
      return;
    }
    staged = std::move(*b);
    land = MemRegion{staged->data(), j.d.len, staged->where()};  // the window: this chunk's bytes only
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
  if (staged) staged_bytes_ += j.d.len;
  rx_[j.d.token] = RxOp{j.seq, j.d.len, stripes(j.d.len), window, std::move(staged), j.dst, j.pieces};
  cts(j.d.token, Cts{reinterpret_cast<uintptr_t>(land.ptr), window->rkey(), false});
}

bool RdmaPath::staging_room(uint64_t len) const {
  return staged_bytes_ == 0 || len <= kMaxStaged - std::min(kMaxStaged, staged_bytes_);
}

void RdmaPath::admit_staged(std::vector<Done>* done) {
  while (!staged_waiting_.empty() && !failed() && staging_room(staged_waiting_.front().d.len)) {
    RxJob j = std::move(staged_waiting_.front());
    staged_waiting_.pop_front();
    start_rx(j, done, /*admitted=*/true);
  }
}

void RdmaPath::on_completion(const ibv_wc& wc, std::vector<Done>* done) {
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
    std::vector<std::shared_ptr<Mr>> owned;  // deregistered outside the lock
    uint64_t seq = 0;
    {
      std::lock_guard lock(tx_mu_);
      auto it = tx_.find(id_token(wc.wr_id));
      if (it == tx_.end() || --it->second.wrs_left > 0) return;
      seq = it->second.seq;
      owned = std::move(it->second.owned);
      tx_.erase(it);
    }
    done->push_back({true, seq, Status()});  // RC: every stripe is in the peer's memory
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
  on_message(qp, slot, wc.byte_len, word, done);
}

// The sender: the receiver's clear-to-send for a large chunk.
void RdmaPath::on_cts(uint32_t token, std::span<const unsigned char> body, std::vector<Done>* done) {
  uint64_t seq = 0, len = 0;
  std::vector<std::shared_ptr<Mr>> owned;
  {
    std::lock_guard lock(tx_mu_);
    auto it = tx_.find(token);
    if (it == tx_.end() || it->second.small || it->second.wrs_left > 0)
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
    uint64_t remote = c->addr;
    uint32_t rkey = c->rkey;
    if (tamper_) remote += static_cast<uint64_t>(tamper_->addr_delta), rkey ^= tamper_->rkey_xor;
    auto plan = plan_writes(token, it->second.from, len, remote, rkey);
    it->second.wrs_left = plan.size();
    pending_writes_.insert(pending_writes_.end(), plan.begin(), plan.end());
  }
  post_writes();
}

std::vector<std::pair<int, RdmaPath::Wr>> RdmaPath::plan_writes(uint32_t token, const std::vector<ibv_sge>& from,
                                                                uint64_t len, uint64_t remote, uint32_t rkey) const {
  std::vector<std::pair<int, Wr>> plan;
  const uint64_t stripe = stripe_size(len);
  const int n = stripes(len);
  const size_t nqp = conn_->qps.size();
  size_t k = 0;     // the source piece
  uint64_t in = 0;  // bytes of it already planned
  for (int i = 0; i < n; ++i) {
    const int qp = static_cast<int>((token + static_cast<uint64_t>(i)) % nqp);
    uint64_t at = static_cast<uint64_t>(i) * stripe;
    uint64_t left = std::min(stripe, len - at);
    while (left > 0 && k < from.size()) {
      Wr w{send_id(kWrWrite, kNoSlot, token), IBV_WR_RDMA_WRITE, remote + at, rkey};
      while (left > 0 && k < from.size() && w.nsge < conn_->send_sge) {
        const uint64_t take = std::min<uint64_t>(from[k].length - in, left);
        w.sge[static_cast<size_t>(w.nsge++)] = ibv_sge{from[k].addr + in, static_cast<uint32_t>(take), from[k].lkey};
        in += take;
        left -= take;
        at += take;
        if (in == from[k].length) ++k, in = 0;
      }
      if (left == 0) {  // the stripe's last: the receiver counts these
        w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        w.imm = htonl(token);
      }
      plan.emplace_back(qp, w);
    }
  }
  return plan;
}

void RdmaPath::post_writes() {
  if (tamper_ && tamper_->hold && tamper_->hold->load()) return;
  for (const auto& [qp, w] : pending_writes_) sq_waiting_[static_cast<size_t>(qp)].push_back(w);
  pending_writes_.clear();
  for (size_t q = 0; q < sq_waiting_.size(); ++q) flush_qp(static_cast<int>(q));
}

Result<Buffer> RdmaPath::staging(uint64_t len) {
  auto best = spare_.end();
  for (auto it = spare_.begin(); it != spare_.end(); ++it)
    if (it->size() >= len && (best == spare_.end() || it->size() < best->size())) best = it;
  if (best != spare_.end()) {  // it holds only what this peer wrote before
    Buffer b = std::move(*best);
    spare_.erase(best);
    return b;
  }
  auto b = Buffer::allocate(MemSpec{MemKind::kPinned, 0}, len);
  if (!b.ok()) b = Buffer::allocate(MemSpec{}, len);
  // Zeroed: a peer that sends every immediate but not every byte must not have us scatter (and
  // then read back) what the allocator left there.
  if (b.ok()) std::memset(b->data(), 0, b->size());
  return b;
}

// The receiver: one stripe of a large chunk is in place.
void RdmaPath::on_written(uint32_t word, std::vector<Done>* done) {
  const uint32_t token = word;
  auto it = rx_.find(token);
  if (it == rx_.end() || word > kMaxToken)
    return protocol(fmt::format("the peer wrote chunk token {:#x}, which is not in flight", word));
  if (--it->second.stripes_left > 0) return;
  RxOp op = std::move(it->second);
  rx_.erase(it);
  op.window.reset();  // its rkey dies now: what the peer wrote is final
  Status landed;
  if (op.staging) {
    staged_bytes_ -= op.len;
    if (op.pieces.empty()) op.pieces.push_back(op.dst);
    landed = scatter(op.pieces, static_cast<const unsigned char*>(op.staging->data()));
    if (!landed.ok()) {
      orphans_.push_back(std::move(*op.staging));  // copies may still read it
      fail_with(landed.with_peer(peer_));          // the device failed or hung: no chunk is safe to land
    } else if (spare_.size() < kSpares && op.staging->size() <= kSpareMax) {
      spare_.push_back(std::move(*op.staging));
    }
  }
  PathCounters::add(counters_.chunks_received);
  PathCounters::add(counters_.bytes_received, op.len);
  done->push_back({false, op.seq, landed.ok() ? landed : landed.with_peer(peer_)});
  admit_staged(done);
}

// Host pieces by memcpy; a run of device pieces of one device as one list on its copy queue (for
// CUDA a copy and a kernel, docs/architecture.md), or one copy each on it when the queue takes no
// lists, then one wait: never a synchronous copy a piece.
Status RdmaPath::scatter(std::span<const MemRegion> pieces, const unsigned char* from) {
  std::vector<CopyQueue::Span> run;
  MemSpec dev{};
  auto flush = [&]() -> Status {
    if (run.empty()) return Status();
    DMX_ASSIGN_OR_RETURN(CopyQueue * q, queues_.get(dev));
    bool listed = false;  // one piece is a plain copy, as is each piece where the queue takes no lists
    if (run.size() > 1) {
      Status s = q->copy_list(run.data(), run.size(), /*to_host=*/false);
      if (s.code() != Code::kUnavailable) DMX_RETURN_IF_ERROR(s);
      listed = s.ok();
    }
    if (!listed)
      for (const CopyQueue::Span& c : run) DMX_RETURN_IF_ERROR(q->to_device(c.dst, c.src, c.n));
    DMX_ASSIGN_OR_RETURN(uint64_t fence, q->record());
    PathCounters::add(counters_.device_copies, run.size());
    run.clear();
    return q->wait(fence, Deadline::after(kCopyWait));
  };
  for (const MemRegion& p : pieces) {
    if (p.size == 0) continue;
    if (host_kind(p.where)) {
      std::memcpy(p.ptr, from, p.size);
      PathCounters::add(counters_.host_copies);
    } else {
      if (!run.empty() && p.where != dev) DMX_RETURN_IF_ERROR(flush());
      dev = p.where;
      run.push_back(CopyQueue::Span{p.ptr, from, p.size});
    }
    from += p.size;
  }
  return flush();
}

void RdmaPath::fail_with(Status s) {
  if (!failed() && !stopping()) DMX_LOG_WARN("{}", s.to_string());
  fail(std::move(s));
}

bool RdmaPath::idle() {
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

void RdmaPath::release(const Status& why, std::vector<Done>* done) {
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
  for (const RxJob& j : staged_waiting_) done->push_back({false, j.seq, why});
  staged_waiting_.clear();
  staged_bytes_ = 0;
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

}  // namespace path_impl

std::unique_ptr<PayloadPath> make_rdma_path(PathSetup setup) {
  return std::make_unique<path_impl::RdmaPath>(std::move(setup));
}

}  // namespace dmx::rdma
