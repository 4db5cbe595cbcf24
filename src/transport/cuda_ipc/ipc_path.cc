// The cuda_ipc payload path: see ipc_path.h for the shape, transport/path.h for the contract.
//
// This file is CUDA-free: it drives the cuda_ipc layer (Exporter, CopyEngine) through its public
// header, which says "built without CUDA" in builds without it.
#include "transport/cuda_ipc/ipc_path.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "core/clock.h"
#include "core/log.h"
#include "core/sys.h"
#include "core/trace.h"
#include "transport/cuda_ipc/ipc_fds.h"
#include "transport/path_base.h"
#include "memory/mps.h"
#include "topo/push.h"

namespace dmx {
namespace {

using cuda_ipc::CopyCompletion;
using cuda_ipc::CopyEngine;
using cuda_ipc::IpcDescriptor;

constexpr auto kSpin = std::chrono::microseconds(200);      // polling after work before the first sleep
constexpr auto kPollSleep = std::chrono::microseconds(20);  // sleeps while copies are pending (plus timer slack)
constexpr auto kStopDrain = std::chrono::seconds(10);       // bound on waiting for copies at stop
constexpr uint32_t kLaneBackoff = 64;                       // chunks the small-chunk lane passes over after a slow copy
constexpr auto kSweepEvery = std::chrono::milliseconds(10);  // how often post_tx looks for freed exports
constexpr size_t kSweepMax = 8;  // allocations it looks at each time (a driver call each, ~0.6-0.9 us)
// Chunks up to this size that arrive together are copied as one batched read (issue_all), at most
// kBatchMax of them per kernel launch.
constexpr uint64_t kBatchChunkMax = 1 << 20;
constexpr size_t kBatchMax = 4096;

class CudaIpcPath final : public PathBase {
  struct RxItem {
    uint64_t seq;
    IpcDescriptor source;
    std::vector<uint64_t> retired;
    MemRegion dst;  // ptr == nullptr: drop; a list's: its first piece's, size the list's bytes
    std::vector<CopyEngine::ListPiece> pieces;  // a table chunk's (post_rx_list); empty otherwise
  };
  struct Inflight {
    explicit Inflight(uint64_t b, size_t p = 1) : bytes(b), parts(p) {}
    uint64_t bytes;
    size_t parts;   // copies still to complete (a list copied piece by piece has one each)
    Status failed;  // the first of its copies that failed
  };

 public:
  CudaIpcPath(std::string peer, int streams, uint64_t max_chunk, bool copy_by_source, bool in_process,
              uint64_t inline_max, std::chrono::microseconds inline_wait, std::unique_ptr<IpcFdChannel> fds)
      : PathBase({.thread_name = "dmx-cuda-ipc",
                  .spin = kSpin,
                  .stopped = Status(Code::kClosed, "the cuda_ipc path is stopped").with_peer(peer)}),
        fds_(std::move(fds)),
        peer_(std::move(peer)),
        streams_(streams),
        max_chunk_(max_chunk),
        copy_by_source_(copy_by_source),
        in_process_(in_process),
        inline_max_(inline_max),
        inline_wait_(inline_wait) {}

  ~CudaIpcPath() override { end_thread(); }

  // Before start(): which small copies the SMs make (topo/push.h).
  void set_push(topo::PushPlan plan) { push_ = std::move(plan); }

  std::string_view name() const override { return "cuda_ipc"; }

  bool carries(const MemSpec& src) const override { return src.kind == MemKind::kCuda; }
  uint64_t max_chunk() const override { return max_chunk_; }
  bool receiver_releases() const override { return true; }

  Result<std::vector<unsigned char>> post_tx(uint64_t /*seq*/, const MemRegion& src, bool whole) override {
    if (!carries(src.where))
      return Status(Code::kInvalidArgument,
                    fmt::format("cuda_ipc carries CUDA device memory only, not {}", to_string(src.where)));
    if (src.size > max_chunk_)
      return Status(Code::kInvalidArgument,
                    fmt::format("cuda_ipc chunk of {} B is larger than the path's {} B", src.size, max_chunk_));
    if (stopping() || failed()) return gate();  // the lock only once closed
    IpcChunkDescriptor d;
    {
      std::lock_guard lock(tx_mu_);
      // A cuMem region that runs into the next block goes in parts, one per block; a message that
      // must go whole cannot.
      DMX_ASSIGN_OR_RETURN(d.source, export_locked(src, whole, "message"));
      d.retired = exporter_.take_retired(kCudaIpcMaxRetired);
      if (fds_) fds_->retire_sent(d.retired);
    }
    PathCounters::add(counters_.chunks_sent);
    PathCounters::add(counters_.bytes_sent, d.source.length);
    return d.encode();
  }

  size_t max_list() const override { return kCudaIpcMaxList; }

  // The pieces of one allocation, from the first: one export (its cached handle), the rest found
  // by address inside that allocation.
  Result<std::vector<unsigned char>> post_tx_list(uint64_t /*seq*/, std::span<const MemRegion> srcs,
                                                  size_t* taken) override {
    if (srcs.empty() || !carries(srcs[0].where))
      return Status(Code::kInvalidArgument, "cuda_ipc lists carry CUDA device memory only");
    if (stopping() || failed()) return gate();
    IpcListDescriptor d;
    {
      std::lock_guard lock(tx_mu_);
      // A piece that runs into the next cuMem block: the list goes chunk by chunk.
      auto e = export_locked(srcs[0], /*whole=*/true, "list's piece");
      if (!e.ok()) return e.status();
      auto base = reinterpret_cast<uintptr_t>(srcs[0].ptr) - e->offset;
      uint64_t lo = e->offset, hi = e->offset + srcs[0].size;
      size_t n = 1;
      d.offsets.reserve(std::min(srcs.size(), kCudaIpcMaxList));
      d.offsets.push_back(e->offset);
      for (; n < std::min(srcs.size(), kCudaIpcMaxList); ++n) {
        auto at = reinterpret_cast<uintptr_t>(srcs[n].ptr);
        if (srcs[n].where != srcs[0].where || at < base || at - base > e->alloc_size ||
            srcs[n].size > e->alloc_size - (at - base))
          break;  // another allocation: the next list
        d.offsets.push_back(at - base);
        lo = std::min<uint64_t>(lo, at - base);
        hi = std::max<uint64_t>(hi, at - base + srcs[n].size);
      }
      for (uint64_t& o : d.offsets) o -= lo;
      d.source = *e;
      d.source.offset = lo;
      d.source.length = hi - lo;
      d.retired = exporter_.take_retired(kCudaIpcMaxRetired);
      if (fds_) fds_->retire_sent(d.retired);
      *taken = n;
    }
    uint64_t bytes = 0;
    for (size_t k = 0; k < *taken; ++k) bytes += srcs[k].size;
    PathCounters::add(counters_.chunks_sent);
    PathCounters::add(counters_.bytes_sent, bytes);
    return d.encode();
  }

  Status post_rx_list(uint64_t seq, std::span<const unsigned char> descriptor,
                      std::span<const MemRegion> dsts) override {
    auto d = IpcListDescriptor::decode(descriptor);
    if (!d.ok()) return d.status().with_peer(peer_);
    if (d->offsets.size() != dsts.size())
      return Status(Code::kProtocol, fmt::format("cuda_ipc list {}: the descriptor names {} pieces, the table {}", seq,
                                                 d->offsets.size(), dsts.size()))
          .with_peer(peer_);
    if (in_process_ && d->source.owner_pid != ::getpid())
      return Status(Code::kProtocol, fmt::format("cuda_ipc list {} in one process: the descriptor names pid {}", seq,
                                                 d->source.owner_pid))
          .with_peer(peer_);
    RxItem item{seq, d->source, std::move(d->retired), MemRegion{nullptr, 0, {}}, {}};
    bool drop = dsts.empty() || dsts[0].ptr == nullptr;
    if (!drop) item.pieces.reserve(dsts.size());
    for (size_t k = 0; k < dsts.size(); ++k) {
      const MemRegion& dst = dsts[k];
      uint64_t off = d->offsets[k];
      if (off > d->source.length || dst.size > d->source.length - off)
        return Status(Code::kProtocol, fmt::format("cuda_ipc list {}: piece {} [{}, +{}) lies outside the {} B region",
                                                   seq, k, off, dst.size, d->source.length))
            .with_peer(peer_);
      if (!drop && (dst.ptr == nullptr || dst.where.kind == MemKind::kSim))
        return Status(Code::kInvalidArgument, fmt::format("cuda_ipc list {}: piece {} cannot receive CUDA copies", seq,
                                                          k))
            .with_peer(peer_);
      item.dst.size += dst.size;
      if (!drop) item.pieces.push_back(CopyEngine::ListPiece{off, dst});
    }
    if (!drop) {
      item.dst.ptr = dsts[0].ptr;
      item.dst.where = dsts[0].where;
    }
    return enqueue(std::move(item));
  }

  Result<uint64_t> chunk_length(std::span<const unsigned char> descriptor) override {
    auto d = IpcChunkDescriptor::decode(descriptor);
    if (!d.ok()) return d.status().with_peer(peer_);
    return d->source.length;
  }

  Status post_rx(uint64_t seq, std::span<const unsigned char> descriptor, const MemRegion& dst) override {
    auto item = rx_item(seq, descriptor, dst);
    if (!item.ok()) return item.status();
    return enqueue(std::move(*item));
  }

  // The small-message lane: an idle path copies a small chunk on the calling thread (the receiving
  // control stream's worker) and polls it there, instead of handing it to the progress thread and
  // hearing back from it. A copy that outlasts inline_wait_ goes on in the progress thread.
  Result<bool> post_rx_now(uint64_t seq, std::span<const unsigned char> descriptor, const MemRegion& dst) override {
    auto item = rx_item(seq, descriptor, dst);
    if (!item.ok()) return item.status();
    if (dst.ptr == nullptr || dst.size > inline_max_ || lane_backoff() || !queue_idle()) {
      DMX_RETURN_IF_ERROR(enqueue(std::move(*item)));
      return false;
    }
    DMX_TRACE_POINT("ipc.inline");
    // try_lock: the progress thread may hold it for long (making a copy engine takes milliseconds),
    // and the caller holds the endpoint's lock.
    std::unique_lock engines(engine_mu_, std::try_to_lock);
    std::optional<int> device;
    if (engines.owns_lock() && inflight_.empty() && failure_.ok()) device = device_for(*item, /*make=*/false);
    if (!device.has_value()) {
      // Busy after all, or the first copy on that GPU (its engine is made on the thread).
      if (engines.owns_lock()) engines.unlock();
      DMX_RETURN_IF_ERROR(enqueue(std::move(*item)));
      return false;
    }
    CopyEngine* engine = engines_.at(*device).get();
    // The chunk was not taken (no copy started, or it failed): the thread reports a broken device.
    auto refuse = [&](Status why) -> Result<bool> {  // by value: completions_ is engine_mu_'s
      note_failure(*engine, why);
      engines.unlock();
      poke();
      return why.with_peer(peer_);
    };
    invalidate_retired(*item);
    Status s = engine->read(seq, dst, peer_, item->source, 0);
    if (!s.ok()) return refuse(s);
    count_pushes();
    DMX_TRACE_POINT("ipc.inline.issued");
    Deadline deadline = Deadline::after(inline_wait_);
    completions_.clear();
    while (engine->progress(&completions_) == 0) {
      if (deadline.expired()) {  // hand it over: the progress thread polls it from now on
        inflight_.emplace(seq, Inflight(dst.size));
        needs_thread_.store(true, std::memory_order_release);
        handed_over_.fetch_add(1, std::memory_order_relaxed);
        // Copies this slow (a GPU shared without MPS, a busy copy engine) would keep the caller
        // waiting in vain: the next kLaneBackoff chunks go to the thread directly.
        lane_skip_.store(kLaneBackoff, std::memory_order_relaxed);
        engines.unlock();
        poke();
        return false;
      }
      cpu_relax();
    }
    DMX_TRACE_POINT("ipc.inline.copied");
    assert(completions_.size() == 1 && completions_.front().op == seq);  // the engine's only copy
    if (!completions_.front().status.ok()) return refuse(completions_.front().status);
    engines.unlock();
    count_received(dst.size);
    PathCounters::add(counters_.inline_copies);
    return true;
  }

  std::string describe() const override {
    std::lock_guard lock(note_mu_);
    std::string mode = in_process_ ? "in one process (the exporter's pointers, no IPC handles); " : "";
    uint64_t fds = cumem_fds_sent_.load(std::memory_order_relaxed);
    std::string cumem = fds == 0 ? "" : fmt::format("; {} cuMem allocations shared by fd", fds);
    if (report_.empty()) return "cuda_ipc: " + mode + "no chunk received yet (copy engines start on the first)" + cumem;
    std::string lane =
        inline_max_ == 0
            ? "; small-chunk lane off"
            : fmt::format(
                  "; {} chunks of <= {} B copied by the receiving stream itself ({} handed on after {} us, "
                  "each time the next {} left to the path's thread)",
                  counters_.inline_copies.load(std::memory_order_relaxed), inline_max_,
                  handed_over_.load(std::memory_order_relaxed), inline_wait_.count(), kLaneBackoff);
    return "cuda_ipc: " + mode + report_ + lane +
           fmt::format("; {} ({} copies pushed)", push_.why, pushes_.load(std::memory_order_relaxed)) + cumem +
           shared_note_;
  }

 private:
  // Exports `src` for a chunk's descriptor (tx_mu_ held). Now and then it first finds exported
  // allocations the user has freed, so that the peer unmaps them with this chunk's retired ids (at
  // most kSweepMax driver calls). A region past its allocation is the caller's error; any other
  // refusal (managed memory, stream-ordered pools, cuMem allocations without fds, no driver), or a
  // `whole` region that runs into the next cuMem block, is kUnavailable: another path carries it.
  Result<IpcDescriptor> export_locked(const MemRegion& src, bool whole, std::string_view what) {
    if (auto now = Clock::now(); now >= next_sweep_) {
      exporter_.sweep(kSweepMax);
      next_sweep_ = now + kSweepEvery;
    }
    auto e = exporter_.export_region(src);
    if (!e.ok() && e.status().code() != Code::kOutOfRange)
      return Status(Code::kUnavailable, fmt::format("cuda_ipc cannot export this memory: {}", e.status().message()))
          .with_peer(peer_);
    if (!e.ok()) return e.status().with_peer(peer_);
    if (e->length < src.size && whole)
      return Status(Code::kUnavailable,
                    fmt::format("cuda_ipc: this {} B {} spans two cuMem allocations (one copy reads one)", src.size,
                                what))
          .with_peer(peer_);
    if (e->kind == IpcDescriptor::Kind::kCuMemFd && !in_process_) DMX_RETURN_IF_ERROR(send_fd_once(e->alloc_id));
    return e;
  }

  // The peer gets a cuMem allocation's fd before the first descriptor naming it (tx_mu_ held).
  // kUnavailable (the chunk goes by another path) when it cannot.
  Status send_fd_once(uint64_t alloc_id) {
    if (!fds_)
      return Status(Code::kUnavailable, "cuda_ipc: a cuMem allocation needs the fd side channel, not connected")
          .with_peer(peer_);
    if (fds_->sent(alloc_id)) return Status();
    auto fd = exporter_.export_fd(alloc_id);
    if (!fd.ok())
      return Status(Code::kUnavailable, fmt::format("cuda_ipc cannot export this memory: {}", fd.status().message()))
          .with_peer(peer_);
    Status s = fds_->send(alloc_id, fd->get());
    if (s.ok()) cumem_fds_sent_.fetch_add(1, std::memory_order_relaxed);
    // Any failure but the peer's death (a full socket, the kernel's limit on fds in flight) sends
    // this chunk by another path.
    if (!s.ok() && s.code() != Code::kPeerFailed)
      return Status(Code::kUnavailable, fmt::format("cuda_ipc could not send a cuMem fd: {}", s.message()))
          .with_peer(peer_);
    return s;
  }

  // Validates a received descriptor and its destination (the checks of post_rx).
  Result<RxItem> rx_item(uint64_t seq, std::span<const unsigned char> descriptor, const MemRegion& dst) {
    auto d = IpcChunkDescriptor::decode(descriptor);
    if (!d.ok()) return d.status().with_peer(peer_);
    if (in_process_ && d->source.owner_pid != ::getpid())
      return Status(Code::kProtocol, fmt::format("cuda_ipc chunk {} in one process: the descriptor names pid {}, not "
                                                 "this process ({})",
                                                 seq, d->source.owner_pid, ::getpid()))
          .with_peer(peer_);
    if (dst.ptr != nullptr) {
      if (dst.size != d->source.length)
        return Status(Code::kInvalidArgument, fmt::format("cuda_ipc chunk {}: destination of {} B for a {} B chunk",
                                                          seq, dst.size, d->source.length))
            .with_peer(peer_);
      if (dst.where.kind == MemKind::kSim)
        return Status(Code::kInvalidArgument, "cuda_ipc: simulated device memory cannot receive CUDA copies")
            .with_peer(peer_);
    }
    return RxItem{seq, std::move(d->source), std::move(d->retired), dst, {}};
  }

  // Hands a chunk to the progress thread.
  Status enqueue(RxItem item) {
    return post([&] { queue_.push_back(std::move(item)); });
  }

  // Nothing waits for the progress thread (the small-chunk lane may take a chunk; under engine_mu_
  // it also checks that no copy is in flight).
  bool queue_idle() const {
    return open_and([&] { return queue_.empty(); });
  }

  // True while the lane backs off after a copy outlasted inline_wait_ (counts the chunks down).
  bool lane_backoff() {
    uint32_t n = lane_skip_.load(std::memory_order_relaxed);
    if (n == 0) return false;
    lane_skip_.store(n - 1, std::memory_order_relaxed);  // callers are serialised by the endpoint's lock
    return true;
  }

  void count_received(uint64_t bytes) {
    PathCounters::add(counters_.chunks_received);
    PathCounters::add(counters_.bytes_received, bytes);
    PathCounters::add(counters_.device_copies);
  }

  // ---- copies (engine_mu_ held) ----

  // The engines' SM copies so far, for describe().
  void count_pushes() {
    uint64_t n = 0;
    for (auto& [dev, engine] : engines_)
      if (engine) n += engine->stats().pushes;
    pushes_.store(n, std::memory_order_relaxed);
  }

  // The local GPU that copies `item` (see docs/shm-cuda-ipc.md): for a cuda destination, the source's
  // GPU when it is ours and reaches the destination (cuda_ipc_copy_by=source), else the
  // destination's; for host destinations the source's GPU (a device-to-host copy on its own copy
  // engine), else cuda:0. `make`: create engines as needed (false: nullopt when one is missing).
  std::optional<int> device_for(const RxItem& item, bool make) {
    int device = 0;
    auto source = cuda_ipc::device_by_uuid(item.source.device_uuid);
    if (item.dst.where.kind == MemKind::kCuda) {
      device = item.dst.where.device;
      if (source.ok() && *source == device && !shared_gpu_noted_ && !in_process_) note_shared_gpu(device);
      if (copy_by_source_ && source.ok() && *source != device) {
        if (!make && !engines_.contains(*source)) return std::nullopt;
        auto e = engine_for(*source);
        if (e.ok() && (*e)->can_access_peer(device)) device = *source;
      }
    } else if (source.ok()) {
      device = *source;
    }
    if (!make && !engines_.contains(device)) return std::nullopt;
    return device;
  }

  void invalidate_retired(const RxItem& item) {
    for (uint64_t id : item.retired) {
      for (auto& [dev, engine] : engines_) engine->invalidate(peer_, id);
      if (fds_) fds_->forget(id);
    }
  }

  // Starts the copy of `item`; true when it is in flight (inflight_), false when it is settled
  // already (pushed to `done`).
  bool issue(RxItem& item, std::vector<Done>* done) {
    invalidate_retired(item);
    if (!failure_.ok()) {
      done->push_back({false, item.seq, failure_});
      return false;
    }
    if (item.dst.ptr == nullptr) {  // a dropped chunk: nothing to copy, the sender may release it
      done->push_back({false, item.seq, Status()});
      return false;
    }
    Result<CopyEngine*> engine = engine_for(*device_for(item, /*make=*/true));
    if (!engine.ok()) {
      done->push_back({false, item.seq, engine.status().with_peer(peer_)});
      return false;
    }
    Status s = (*engine)->read(item.seq, item.dst, peer_, item.source, 0);
    if (!s.ok()) {
      done->push_back({false, item.seq, s.with_peer(peer_)});
      note_failure(**engine, s);
      return false;
    }
    count_pushes();
    inflight_.emplace(item.seq, Inflight(item.dst.size));
    return true;
  }

  // Issues this round's posts (batch_). Runs of small chunks into device memory that one GPU
  // copies go to its engine as one batched read — one kernel launch for the run, instead of a
  // copy-engine copy each, whose fixed cost is more than a small chunk's bytes (a vectored write of
  // thousands of KV-cache blocks); the rest, and a run the engine cannot batch, one by one. A run
  // ends before a chunk that retires allocations (their mappings close before it is copied).
  void issue_all(std::vector<Done>* done) {
    auto small = [&](const RxItem& item) {
      return failure_.ok() && item.dst.ptr != nullptr && item.dst.where.kind == MemKind::kCuda &&
             item.dst.size <= kBatchChunkMax;
    };
    size_t i = 0;
    while (i < batch_.size()) {
      size_t j = i + 1;
      std::optional<int> device;
      if (!batch_[i].pieces.empty()) {  // a run of lists that one GPU copies: one launch
        device = device_for(batch_[i], /*make=*/true);
        size_t pieces = batch_[i].pieces.size();
        while (j < batch_.size() && !batch_[j].pieces.empty() && batch_[j].retired.empty() &&
               pieces + batch_[j].pieces.size() <= kBatchMax && device_for(batch_[j], /*make=*/true) == device) {
          pieces += batch_[j].pieces.size();
          ++j;
        }
        if (!issue_run(i, j, *device, done))
          for (size_t k = i; k < j; ++k) issue_pieces(batch_[k], done);
        i = j;
        continue;
      }
      if (small(batch_[i])) {
        device = device_for(batch_[i], /*make=*/true);
        while (j < batch_.size() && j - i < kBatchMax && small(batch_[j]) && batch_[j].retired.empty() &&
               device_for(batch_[j], /*make=*/true) == device)
          ++j;
      }
      if (j - i < 2 || !issue_run(i, j, *device, done))
        for (size_t k = i; k < j; ++k) issue(batch_[k], done);
      i = j;
    }
  }

  // Issues batch_[i, j) — all lists, or all small chunks (a list of one piece each) — as one
  // read_lists on `device`'s engine; false (nothing issued) when the engine cannot batch them (a
  // destination it cannot write, gpu push): the caller issues them one by one, and says why. A
  // failure settles every item of the run.
  bool issue_run(size_t i, size_t j, int device, std::vector<Done>* done) {
    invalidate_retired(batch_[i]);  // only the first of a run may retire allocations
    if (!failure_.ok()) return false;
    Result<CopyEngine*> engine = engine_for(device);
    if (!engine.ok()) return false;
    list_reads_.clear();
    single_pieces_.clear();
    single_pieces_.reserve(j - i);  // the lists' spans point into it
    for (size_t k = i; k < j; ++k) {
      std::span<const CopyEngine::ListPiece> pieces = batch_[k].pieces;
      if (pieces.empty()) {
        single_pieces_.push_back(CopyEngine::ListPiece{0, batch_[k].dst});
        pieces = std::span<const CopyEngine::ListPiece>(&single_pieces_.back(), 1);
      }
      list_reads_.push_back(CopyEngine::ListRead{batch_[k].seq, &batch_[k].source, pieces});
    }
    DMX_TRACE_POINT("ipc.lists");
    Status s = (*engine)->read_lists(list_reads_, peer_);
    DMX_TRACE_POINT("ipc.listed");
    if (s.code() == Code::kUnavailable) return false;
    for (size_t k = i; k < j; ++k) {
      if (s.ok()) inflight_.emplace(batch_[k].seq, Inflight(batch_[k].dst.size));
      else done->push_back({false, batch_[k].seq, s.with_peer(peer_)});
    }
    if (!s.ok()) note_failure(**engine, s);
    return true;
  }

  // A list copied piece by piece (each a copy of its own, one completion for them all).
  void issue_pieces(RxItem& item, std::vector<Done>* done) {
    invalidate_retired(item);
    if (!failure_.ok()) {
      done->push_back({false, item.seq, failure_});
      return;
    }
    Result<CopyEngine*> engine = engine_for(*device_for(item, /*make=*/true));
    if (!engine.ok()) {
      done->push_back({false, item.seq, engine.status().with_peer(peer_)});
      return;
    }
    Inflight f(item.dst.size, 0);
    for (const CopyEngine::ListPiece& p : item.pieces) {
      Status s = (*engine)->read(item.seq, p.local, peer_, item.source, p.remote_offset);
      if (!s.ok()) {
        f.failed = s.with_peer(peer_);
        note_failure(**engine, s);
        break;
      }
      ++f.parts;
    }
    count_pushes();
    if (f.parts == 0) done->push_back({false, item.seq, f.failed});
    else inflight_.emplace(item.seq, std::move(f));
  }

  void poll(std::vector<Done>* done) {
    if (inflight_.empty()) return;
    completions_.clear();
    for (auto& [dev, engine] : engines_) {
      size_t before = completions_.size();
      if (engine->progress(&completions_) == 0) continue;
      for (size_t i = before; i < completions_.size(); ++i)
        if (!completions_[i].status.ok()) {
          note_failure(*engine, completions_[i].status);
          break;
        }
    }
    for (CopyCompletion& c : completions_) {
      auto it = inflight_.find(c.op);
      assert(it != inflight_.end());
      if (it == inflight_.end()) continue;
      if (!c.status.ok() && it->second.failed.ok()) it->second.failed = c.status;
      if (--it->second.parts > 0) continue;
      uint64_t bytes = it->second.bytes;
      if (!it->second.failed.ok()) c.status = std::move(it->second.failed);
      inflight_.erase(it);
      if (c.status.ok() && failure_.ok()) {
        count_received(bytes);
        done->push_back({false, c.op, Status()});
      } else {
        done->push_back({false, c.op, !failure_.ok() ? failure_ : c.status.with_peer(peer_)});
      }
    }
  }

  // A copy failed: if the device is broken for good (sticky CUDA error), so is the path (the
  // progress thread ends after its round: PathBase).
  void note_failure(CopyEngine& engine, const Status& why) {
    Status sticky = engine.device_error();
    if (sticky.ok() || !failure_.ok()) return;
    failure_ =
        Status(sticky.code(), fmt::format("cuda_ipc path failed: {} (after: {})", sticky.message(), why.message()))
            .with_peer(peer_);
    DMX_LOG_ERROR("{}", failure_.to_string());
    fail(failure_);
  }

  // Both processes use one GPU: say once whether MPS serves it (without it, every copy that follows
  // the peer's work on that GPU waits for a context switch; see memory/mps.h).
  void note_shared_gpu(int device) {
    shared_gpu_noted_ = true;
    auto mps = cuda_mps_daemon();
    std::string note =
        mps.ok() ? fmt::format("cuda:{} is shared with the peer's process; MPS serves it ({})", device, *mps)
                 : fmt::format("cuda:{} is shared with the peer's process without MPS ({}): the GPU switches between "
                               "the two processes' contexts (8-byte messages measured 167 us instead of 18 us "
                               "on an H200); nvidia-cuda-mps-control -d starts MPS",
                               device, mps.status().message());
    if (mps.ok()) DMX_LOG_INFO("cuda_ipc to {}: {}", peer_, note);
    else DMX_LOG_WARN("cuda_ipc to {}: {}", peer_, note);
    std::lock_guard lock(note_mu_);
    shared_note_ = "; " + note;
  }

  Result<CopyEngine*> engine_for(int device) {
    auto it = engines_.find(device);
    if (it != engines_.end()) return it->second.get();
    auto e = CopyEngine::create(
        {.device = device, .streams = streams_, .in_process = in_process_, .fds = fds_.get(), .push_max = push_.max});
    if (!e.ok()) return e.status();
    CopyEngine* raw = e->get();
    engines_.emplace(device, std::move(*e));
    std::string report;
    for (auto& [dev, engine] : engines_) report += engine->peer_access_report();
    std::lock_guard lock(note_mu_);
    report_ = std::move(report);
    return raw;
  }

  // ---- PathBase's hooks (the progress thread) ----

  // Issues the posted copies and polls those in flight. While spinning with nothing posted and no
  // copy in flight the post lock is not taken (a poster — the endpoint's stream worker — would
  // otherwise often find it held).
  bool progress(std::vector<Done>* done) override {
    take_posts([&] {
      batch_.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
      queue_.clear();
    });
    bool worked = !batch_.empty();
    size_t before = done->size();
    if (worked || needs_thread_.load(std::memory_order_acquire)) {
      std::lock_guard engines(engine_mu_);
      if (worked) DMX_TRACE_POINT("ipc.take");
      issue_all(done);
      if (worked) DMX_TRACE_POINT("ipc.issued");
      batch_.clear();
      poll(done);
      if (done->size() > before) DMX_TRACE_POINT("ipc.copied");
      needs_thread_.store(!inflight_.empty(), std::memory_order_release);
    }
    return worked || done->size() > before;
  }

  // After kSpin: sleep until a post, or for kPollSleep while copies are in flight.
  bool idle() override {
    return sleep_on({}, needs_thread_.load(std::memory_order_acquire)
                            ? std::optional<std::chrono::microseconds>(kPollSleep)
                            : std::nullopt);
  }

  void release(const Status& why, std::vector<Done>* done) override {
    std::deque<RxItem> rest;
    take_posts([&] { rest.swap(queue_); });
    Status cancelled = failed() ? why
                                : Status(Code::kCancelled, "the cuda_ipc path stopped before the chunk was copied")
                                      .with_peer(peer_);
    for (RxItem& item : rest) done->push_back({false, item.seq, item.dst.ptr == nullptr ? Status() : cancelled});
    // Copies in flight write into the user's memory: wait for them before saying we are done. The
    // lane's caller (a stream worker) is gone by now, or finds the engines gone and the path closed.
    std::unique_lock engines(engine_mu_);
    Deadline deadline = Deadline::after(kStopDrain);
    while (!inflight_.empty() && !deadline.expired()) {
      poll(done);
      if (inflight_.empty()) break;
      engines.unlock();
      std::this_thread::sleep_for(kPollSleep);
      engines.lock();
    }
    if (!inflight_.empty()) {
      // A hung device: never hang the caller. The engines are leaked rather than destroyed (their
      // destructor would synchronise with the hung streams).
      Status s = Status(Code::kTimeout, fmt::format("cuda_ipc path stop: {} copies still in flight after {} s; the "
                                                    "device seems hung, their destinations may still change",
                                                    inflight_.size(), kStopDrain.count()))
                     .with_peer(peer_);
      DMX_LOG_ERROR("{}", s.to_string());
      for (auto& [seq, f] : inflight_) done->push_back({false, seq, s});
      inflight_.clear();
      for (auto& [dev, engine] : engines_) (void)engine.release();
    }
    // Drop our mappings of the peer's memory (the engines' import caches close them).
    for (auto& [dev, engine] : engines_)
      if (engine) engine->drop_peer(peer_);
    engines_.clear();
  }

  // The cuMem fd side channel (null: cuMem memory goes by other paths). Its sending half is used
  // under tx_mu_, its receiving half under engine_mu_; declared first, it outlives the engines.
  std::unique_ptr<IpcFdChannel> fds_;
  const std::string peer_;
  const int streams_;
  const uint64_t max_chunk_;
  const bool copy_by_source_;
  const bool in_process_;
  const uint64_t inline_max_;                    // the small-chunk lane: largest chunk (0: off)
  const std::chrono::microseconds inline_wait_;  // and how long its caller polls a copy
  topo::PushPlan push_;  // GPU push for small copies (set before the path starts)
  std::atomic<uint64_t> pushes_{0};  // copies the engines' SMs made (count_pushes)

  std::mutex tx_mu_;  // guards exporter_, next_sweep_
  cuda_ipc::Exporter exporter_;
  Clock::time_point next_sweep_{};

  std::deque<RxItem> queue_;   // under the post lock (PathBase::post)
  std::vector<RxItem> batch_;  // the thread's: posts taken for this round
  std::vector<CopyEngine::ListRead> list_reads_;        // issue_run's scratch (engine_mu_)
  std::vector<CopyEngine::ListPiece> single_pieces_;  // its one-piece lists' pieces

  mutable std::mutex note_mu_;  // guards report_, shared_note_
  std::string report_;
  std::string shared_note_;  // "; cuda:N is shared with the peer's process ..." once seen

  // The copy side: the progress thread, and the small-chunk lane's caller, under engine_mu_ (taken
  // before the post lock and note_mu_, never after them).
  std::mutex engine_mu_;
  std::map<int, std::unique_ptr<CopyEngine>> engines_;  // by local device
  std::unordered_map<uint64_t, Inflight> inflight_;     // by seq (the copy's op)
  std::vector<CopyCompletion> completions_;
  Status failure_;  // the device is broken (also PathBase::fail)
  bool shared_gpu_noted_ = false;
  std::atomic<bool> needs_thread_{false};  // copies in flight (written under engine_mu_)
  std::atomic<uint32_t> lane_skip_{0};     // chunks the lane still leaves to the thread (lane_backoff)

  std::atomic<uint64_t> handed_over_{0}, cumem_fds_sent_{0};
};

}  // namespace

Status cuda_ipc_path_available() { return cuda_ipc::available(); }

Status cuda_ipc_usable_between(uint32_t my_pid, uint32_t peer_pid, bool proven_same_process) {
  if (my_pid == peer_pid && !proven_same_process)
    return Status(Code::kUnavailable, fmt::format("both endpoints say they are one process (pid {}), and no side "
                                                  "channel proves it (CUDA IPC cannot open its own handles; sharing "
                                                  "pointers needs the shm path or the control pipe)",
                                                  my_pid));
  return Status();
}

topo::PushPlan cuda_ipc_push_plan(const Config& config) {
  auto mode = topo::parse_push_mode(config.get_string("gpu_push"));
  topo::PushMode m = mode.ok() ? *mode : topo::PushMode::kAuto;  // the context checked it
  topo::PushPlan plan =
      topo::plan_gpu_push(m, config.get_size("gpu_push_max"), topo::push_facts(topo::PushLink::kPeerGpu));
  if (m == topo::PushMode::kAuto && config.get_string("cuda_ipc_copy_by") == "destination") {
    // The destination's SMs would read the peer's memory over the peer link: not seed 002's
    // posted writes. Left to the copy engine.
    plan.max = 0;
    plan.why = "no gpu push: cuda_ipc_copy_by=destination makes the SMs read the peer's memory (reads, not posted "
               "writes); copy engine";
  }
  return plan;
}

std::unique_ptr<PayloadPath> new_cuda_ipc_path(const Config& config, std::string peer, bool in_process,
                                               std::optional<UnixChannel> fd_channel) {
  int streams = static_cast<int>(std::clamp<int64_t>(config.get_int("cuda_ipc_streams"), 1, 16));
  uint64_t chunk = std::clamp<uint64_t>(config.get_size("cuda_ipc_chunk"), 1ull << 20, 1ull << 30);
  // The lane holds the endpoint's lock while it polls: bounded to small chunks and short waits.
  uint64_t inline_max = std::min<uint64_t>(config.get_size("cuda_ipc_inline_rx"), 1ull << 20);
  auto inline_wait = std::min(config.get_duration("cuda_ipc_inline_wait"), std::chrono::microseconds(1000));
  std::unique_ptr<IpcFdChannel> fds;
  if (fd_channel) fds = std::make_unique<IpcFdChannel>(std::move(*fd_channel), peer);
  bool by_source = config.get_string("cuda_ipc_copy_by") != "destination";
  auto path = std::make_unique<CudaIpcPath>(std::move(peer), streams, chunk, by_source, in_process, inline_max,
                                            inline_wait, std::move(fds));
  path->set_push(cuda_ipc_push_plan(config));
  return path;
}

Result<std::unique_ptr<PayloadPath>> make_cuda_ipc_path(const Config& config, std::string peer, bool in_process,
                                                        std::optional<UnixChannel> fd_channel) {
  DMX_RETURN_IF_ERROR(cuda_ipc_path_available());
  return new_cuda_ipc_path(config, std::move(peer), in_process, std::move(fd_channel));
}

}  // namespace dmx
