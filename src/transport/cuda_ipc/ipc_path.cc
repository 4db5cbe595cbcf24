// The cuda_ipc payload path: see ipc_path.h for the shape, transport/path.h for the contract.
//
// This file is CUDA-free: it drives the cuda_ipc layer (Exporter, CopyEngine) through its public
// header, which says "built without CUDA" in builds without it.
#include "transport/cuda_ipc/ipc_path.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "core/clock.h"
#include "core/log.h"
#include "core/reaper.h"
#include "core/sys.h"
#include "core/trace.h"
#include "transport/cuda_ipc/ipc_fds.h"
#include "memory/mps.h"

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

class CudaIpcPath final : public PayloadPath {
  struct RxItem {
    uint64_t seq;
    IpcDescriptor source;
    std::vector<uint64_t> retired;
    MemRegion dst;  // ptr == nullptr: drop
  };
  struct Done {
    uint64_t seq;
    Status status;
  };
  struct Inflight {
    uint64_t bytes;
  };

 public:
  CudaIpcPath(std::string peer, int streams, uint64_t max_chunk, bool copy_by_source, bool in_process,
              uint64_t inline_max, std::chrono::microseconds inline_wait, std::unique_ptr<IpcFdChannel> fds)
      : fds_(std::move(fds)),
        peer_(std::move(peer)),
        streams_(streams),
        max_chunk_(max_chunk),
        copy_by_source_(copy_by_source),
        in_process_(in_process),
        inline_max_(inline_max),
        inline_wait_(inline_wait) {}

  ~CudaIpcPath() override {
    stop();
    std::lock_guard lock(join_mu_);
    // Still joinable only when the last owner let go on the path's own thread (keep_alive released
    // after on_path_stopped): that thread is past its last use of *this, and the reaper joins it.
    join_or_reap(thread_);
  }

  std::string_view name() const override { return "cuda_ipc"; }

  void start(Events* events, std::shared_ptr<void> keep_alive) override {
    std::lock_guard lock(join_mu_);
    assert(!started_ && "PayloadPath::start called twice");
    if (started_) return;
    started_ = true;
    events_ = events;
    keep_alive_ = std::move(keep_alive);
    thread_ = std::thread([this] { run(); });
  }

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
    {
      std::lock_guard lock(mu_);
      if (stopping_) return closed();
    }
    IpcChunkDescriptor d;
    {
      std::lock_guard lock(tx_mu_);
      // Now and then, find exported allocations the user has freed, so that the peer unmaps them
      // with this chunk's retired ids (at most kSweepMax driver calls).
      if (auto now = Clock::now(); now >= next_sweep_) {
        exporter_.sweep(kSweepMax);
        next_sweep_ = now + kSweepEvery;
      }
      auto e = exporter_.export_region(src);
      // A region past its allocation is the caller's error; any other refusal (managed memory,
      // stream-ordered pools, cuMem allocations without fds, no driver) means another path must
      // carry it.
      if (!e.ok() && e.status().code() != Code::kOutOfRange)
        return Status(Code::kUnavailable, fmt::format("cuda_ipc cannot export this memory: {}", e.status().message()))
            .with_peer(peer_);
      if (!e.ok()) return e.status().with_peer(peer_);
      // A cuMem region that runs into the next block goes in parts, one per block; a message that
      // must go whole cannot.
      if (e->length < src.size && whole)
        return Status(Code::kUnavailable, fmt::format("cuda_ipc: this {} B message spans two cuMem allocations (one "
                                                      "copy reads one)",
                                                      src.size))
            .with_peer(peer_);
      if (e->kind == IpcDescriptor::Kind::kCuMemFd && !in_process_) DMX_RETURN_IF_ERROR(send_fd_once(e->alloc_id));
      d.source = *e;
      d.retired = exporter_.take_retired(kCudaIpcMaxRetired);
      if (fds_) fds_->retire_sent(d.retired);
    }
    chunks_sent_.fetch_add(1, std::memory_order_relaxed);
    bytes_sent_.fetch_add(d.source.length, std::memory_order_relaxed);
    return d.encode();
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
      note_failure(*engine, why, 0);
      engines.unlock();
      poke();
      return why.with_peer(peer_);
    };
    invalidate_retired(*item);
    Status s = engine->read(seq, dst, peer_, item->source, 0);
    if (!s.ok()) return refuse(s);
    DMX_TRACE_POINT("ipc.inline.issued");
    Deadline deadline = Deadline::after(inline_wait_);
    completions_.clear();
    while (engine->progress(&completions_) == 0) {
      if (deadline.expired()) {  // hand it over: the progress thread polls it from now on
        inflight_.emplace(seq, Inflight{dst.size});
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
    inline_copies_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  void stop() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      posted_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
    std::lock_guard lock(join_mu_);
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  }

  PathStats stats() const override {
    PathStats s;
    s.chunks_sent = chunks_sent_.load(std::memory_order_relaxed);
    s.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
    s.chunks_received = chunks_received_.load(std::memory_order_relaxed);
    s.bytes_received = bytes_received_.load(std::memory_order_relaxed);
    s.device_copies = device_copies_.load(std::memory_order_relaxed);
    s.wakeups = wakeups_.load(std::memory_order_relaxed);
    s.inline_copies = inline_copies_.load(std::memory_order_relaxed);
    return s;
  }

  std::string describe() const override {
    std::lock_guard lock(mu_);
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
                  inline_copies_.load(std::memory_order_relaxed), inline_max_,
                  handed_over_.load(std::memory_order_relaxed), inline_wait_.count(), kLaneBackoff);
    return "cuda_ipc: " + mode + report_ + lane + cumem + shared_note_;
  }

 private:
  Status closed() const { return Status(Code::kClosed, "the cuda_ipc path is stopped").with_peer(peer_); }

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
    return RxItem{seq, std::move(d->source), std::move(d->retired), dst};
  }

  // Hands a chunk to the progress thread.
  Status enqueue(RxItem item) {
    std::lock_guard lock(mu_);
    if (stopping_) return closed();
    if (!failed_.ok()) return failed_;
    queue_.push_back(std::move(item));
    wake_locked();
    return Status();
  }

  // Nothing waits for the progress thread (the small-chunk lane may take a chunk; under engine_mu_
  // it also checks that no copy is in flight).
  bool queue_idle() const {
    std::lock_guard lock(mu_);
    return queue_.empty() && !stopping_ && failed_.ok();
  }

  // True while the lane backs off after a copy outlasted inline_wait_ (counts the chunks down).
  bool lane_backoff() {
    uint32_t n = lane_skip_.load(std::memory_order_relaxed);
    if (n == 0) return false;
    lane_skip_.store(n - 1, std::memory_order_relaxed);  // callers are serialised by the endpoint's lock
    return true;
  }

  // Makes the progress thread look now (a copy handed over, a failure to report).
  void poke() {
    std::lock_guard lock(mu_);
    wake_locked();
  }
  void wake_locked() {  // mu_ held
    posted_.store(true, std::memory_order_release);
    if (sleeping_) cv_.notify_one();
  }

  void count_received(uint64_t bytes) {
    chunks_received_.fetch_add(1, std::memory_order_relaxed);
    bytes_received_.fetch_add(bytes, std::memory_order_relaxed);
    device_copies_.fetch_add(1, std::memory_order_relaxed);
  }

  // ---- copies (engine_mu_ held) ----

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
      done->push_back({item.seq, failure_});
      return false;
    }
    if (item.dst.ptr == nullptr) {  // a dropped chunk: nothing to copy, the sender may release it
      done->push_back({item.seq, Status()});
      return false;
    }
    Result<CopyEngine*> engine = engine_for(*device_for(item, /*make=*/true));
    if (!engine.ok()) {
      done->push_back({item.seq, engine.status().with_peer(peer_)});
      return false;
    }
    Status s = (*engine)->read(item.seq, item.dst, peer_, item.source, 0);
    if (!s.ok()) {
      done->push_back({item.seq, s.with_peer(peer_)});
      note_failure(**engine, s, done->size());
      return false;
    }
    inflight_.emplace(item.seq, Inflight{item.dst.size});
    return true;
  }

  void poll(std::vector<Done>* done) {
    if (inflight_.empty()) return;
    completions_.clear();
    for (auto& [dev, engine] : engines_) {
      size_t before = completions_.size();
      if (engine->progress(&completions_) == 0) continue;
      for (size_t i = before; i < completions_.size(); ++i)
        if (!completions_[i].status.ok()) {
          note_failure(*engine, completions_[i].status, done->size());
          break;
        }
    }
    for (CopyCompletion& c : completions_) {
      auto it = inflight_.find(c.op);
      assert(it != inflight_.end());
      if (it == inflight_.end()) continue;
      uint64_t bytes = it->second.bytes;
      inflight_.erase(it);
      if (c.status.ok() && failure_.ok()) {
        count_received(bytes);
        done->push_back({c.op, Status()});
      } else {
        done->push_back({c.op, !failure_.ok() ? failure_ : c.status.with_peer(peer_)});
      }
    }
  }

  // A copy failed: if the device is broken for good (sticky CUDA error), so is the path. The
  // progress thread reports it (on_path_failed) after the completions before `done_before`.
  void note_failure(CopyEngine& engine, const Status& why, size_t done_before) {
    Status sticky = engine.device_error();
    if (sticky.ok() || !failure_.ok()) return;
    failure_ =
        Status(sticky.code(), fmt::format("cuda_ipc path failed: {} (after: {})", sticky.message(), why.message()))
            .with_peer(peer_);
    DMX_LOG_ERROR("{}", failure_.to_string());
    failure_unreported_ = true;
    failed_before_ = done_before;
    needs_thread_.store(true, std::memory_order_release);
    std::lock_guard lock(mu_);
    failed_ = failure_;
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
    std::lock_guard lock(mu_);
    shared_note_ = "; " + note;
  }

  Result<CopyEngine*> engine_for(int device) {
    auto it = engines_.find(device);
    if (it != engines_.end()) return it->second.get();
    auto e = CopyEngine::create({.device = device, .streams = streams_, .in_process = in_process_, .fds = fds_.get()});
    if (!e.ok()) return e.status();
    CopyEngine* raw = e->get();
    engines_.emplace(device, std::move(*e));
    std::string report;
    for (auto& [dev, engine] : engines_) report += engine->peer_access_report();
    std::lock_guard lock(mu_);
    report_ = std::move(report);
    return raw;
  }

  // ---- the progress thread ----

  void run() {
    std::vector<RxItem> batch;
    std::vector<Done> done;
    bool idle = false;
    Clock::time_point idle_since;
    for (;;) {
      // After work, poll for kSpin before sleeping: a chunk that follows soon (a small message
      // of a ping-pong) then costs no wake-up. While spinning with nothing posted the lock is not
      // taken (a poster — the endpoint's stream worker — would otherwise often find it held).
      bool spinning = !idle || Clock::now() - idle_since < kSpin;
      if (!spinning || posted_.load(std::memory_order_acquire)) {
        std::unique_lock lock(mu_);
        auto ready = [&] { return stopping_ || !queue_.empty() || posted_.load(std::memory_order_relaxed); };
        if (!ready() && !spinning) {
          sleeping_ = true;
          if (!needs_thread_.load(std::memory_order_acquire)) {
            cv_.wait(lock, ready);
            if (!stopping_) wakeups_.fetch_add(1, std::memory_order_relaxed);
          } else if (cv_.wait_for(lock, kPollSleep, ready) && !stopping_) {
            wakeups_.fetch_add(1, std::memory_order_relaxed);
          }
          sleeping_ = false;
        }
        if (stopping_) break;
        batch.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
        queue_.clear();
        posted_.store(false, std::memory_order_relaxed);  // under mu_: a later post sets it again
      }
      bool worked = !batch.empty();
      std::optional<Status> broke;  // the path failed: report it after done[0, failed_before_)
      size_t broke_at = 0;
      if (worked || needs_thread_.load(std::memory_order_acquire)) {
        std::lock_guard engines(engine_mu_);
        if (worked) DMX_TRACE_POINT("ipc.take");
        for (RxItem& item : batch) issue(item, &done);
        if (worked) DMX_TRACE_POINT("ipc.issued");
        batch.clear();
        poll(&done);
        if (!done.empty()) DMX_TRACE_POINT("ipc.copied");
        if (failure_unreported_) {
          failure_unreported_ = false;
          broke = failure_;
          broke_at = std::min(failed_before_, done.size());
        }
        needs_thread_.store(!inflight_.empty(), std::memory_order_release);
      }
      worked = worked || !done.empty() || broke.has_value();
      deliver(&done, broke, broke_at);
      if (worked) {
        idle = false;
      } else if (!idle) {
        idle = true;
        idle_since = Clock::now();
      } else {
        cpu_relax();
      }
    }
    shutdown(&done);
  }

  // Reports `done` in order; when the path broke, on_path_failed goes before done[broke_at].
  void deliver(std::vector<Done>* done, const std::optional<Status>& broke = std::nullopt, size_t broke_at = 0) {
    if (events_ != nullptr) {
      for (size_t i = 0; i <= done->size(); ++i) {
        if (broke.has_value() && i == broke_at) events_->on_path_failed(*broke);
        if (i < done->size()) events_->on_path_rx_done((*done)[i].seq, (*done)[i].status);
      }
    }
    done->clear();
  }

  void shutdown(std::vector<Done>* done) {
    std::deque<RxItem> rest;
    {
      std::lock_guard lock(mu_);
      rest.swap(queue_);
    }
    for (RxItem& item : rest)
      done->push_back({item.seq, item.dst.ptr == nullptr
                                     ? Status()
                                     : Status(Code::kCancelled, "the cuda_ipc path stopped before the chunk was copied")
                                           .with_peer(peer_)});
    deliver(done);
    // Copies in flight write into the user's memory: wait for them before saying we are done. The
    // lane's caller (a stream worker) is gone by now, or finds the engines gone and the path stopped.
    std::unique_lock engines(engine_mu_);
    Deadline deadline = Deadline::after(kStopDrain);
    while (!inflight_.empty() && !deadline.expired()) {
      poll(done);
      bool more = !inflight_.empty();
      engines.unlock();
      deliver(done);
      if (more) std::this_thread::sleep_for(kPollSleep);
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
      for (auto& [seq, f] : inflight_) done->push_back({seq, s});
      inflight_.clear();
      for (auto& [dev, engine] : engines_) (void)engine.release();
    }
    // Drop our mappings of the peer's memory (the engines' import caches close them).
    for (auto& [dev, engine] : engines_)
      if (engine) engine->drop_peer(peer_);
    engines_.clear();
    engines.unlock();
    deliver(done);
    Events* events = events_;
    std::shared_ptr<void> keep = std::move(keep_alive_);
    if (events != nullptr) events->on_path_stopped();
    // `keep` goes last: it may own this path, whose destructor then runs here and hands us to the
    // reaper (core/reaper.h).
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

  // Set by start() before the thread runs, read by the thread.
  Events* events_ = nullptr;
  std::shared_ptr<void> keep_alive_;

  std::mutex join_mu_;  // guards thread_, started_
  std::thread thread_;
  bool started_ = false;

  std::mutex tx_mu_;  // guards exporter_, next_sweep_
  cuda_ipc::Exporter exporter_;
  Clock::time_point next_sweep_{};

  mutable std::mutex mu_;  // guards queue_, stopping_, sleeping_, failed_, report_, shared_note_
  std::condition_variable cv_;
  std::deque<RxItem> queue_;
  bool stopping_ = false;
  std::atomic<bool> posted_{false};  // queue_ non-empty, stopping_, or a poke: the spinning thread looks
  bool sleeping_ = false;
  Status failed_;
  std::string report_;
  std::string shared_note_;  // "; cuda:N is shared with the peer's process ..." once seen

  // The copy side: the progress thread, and the small-chunk lane's caller, under engine_mu_ (taken
  // before mu_, never after it).
  std::mutex engine_mu_;
  std::map<int, std::unique_ptr<CopyEngine>> engines_;  // by local device
  std::unordered_map<uint64_t, Inflight> inflight_;     // by seq (the copy's op)
  std::vector<CopyCompletion> completions_;
  Status failure_;
  bool failure_unreported_ = false;  // on_path_failed is still to come (from the progress thread)
  size_t failed_before_ = 0;         // it comes before that many of the thread's pending completions
  bool shared_gpu_noted_ = false;
  std::atomic<bool> needs_thread_{false};  // copies in flight or a failure to report (written under engine_mu_)
  std::atomic<uint32_t> lane_skip_{0};     // chunks the lane still leaves to the thread (lane_backoff)

  std::atomic<uint64_t> chunks_sent_{0}, bytes_sent_{0}, chunks_received_{0}, bytes_received_{0}, device_copies_{0},
      wakeups_{0}, inline_copies_{0}, handed_over_{0}, cumem_fds_sent_{0};
};

}  // namespace

std::vector<unsigned char> IpcChunkDescriptor::encode() const {
  assert(retired.size() <= kCudaIpcMaxRetired);
  std::vector<std::byte> ipc = source.encode();
  std::vector<unsigned char> out(ipc.size() + 8 * retired.size());
  std::memcpy(out.data(), ipc.data(), ipc.size());
  for (size_t i = 0; i < retired.size(); ++i) std::memcpy(out.data() + ipc.size() + 8 * i, &retired[i], 8);
  return out;
}

Result<IpcChunkDescriptor> IpcChunkDescriptor::decode(std::span<const unsigned char> in) {
  constexpr size_t kBase = IpcDescriptor::kWireSize;
  if (in.size() < kBase || (in.size() - kBase) % 8 != 0 || (in.size() - kBase) / 8 > kCudaIpcMaxRetired)
    return Status(Code::kProtocol, fmt::format("cuda_ipc chunk descriptor of {} B (expected {} + 8 x [0, {}])",
                                               in.size(), kBase, kCudaIpcMaxRetired));
  IpcChunkDescriptor d;
  DMX_ASSIGN_OR_RETURN(d.source, IpcDescriptor::decode(std::as_bytes(in.first(kBase))));
  for (size_t at = kBase; at < in.size(); at += 8) {
    uint64_t id = 0;
    std::memcpy(&id, in.data() + at, 8);
    if (id == 0) return Status(Code::kProtocol, "cuda_ipc chunk descriptor: retired allocation id 0");
    d.retired.push_back(id);
  }
  return d;
}

Status cuda_ipc_path_available() { return cuda_ipc::available(); }

Status cuda_ipc_usable_between(uint32_t my_pid, uint32_t peer_pid, bool proven_same_process) {
  if (my_pid == peer_pid && !proven_same_process)
    return Status(Code::kUnavailable, fmt::format("both endpoints say they are one process (pid {}), and no side "
                                                  "channel proves it (CUDA IPC cannot open its own handles; sharing "
                                                  "pointers needs the shm path or the control pipe)",
                                                  my_pid));
  return Status();
}

std::unique_ptr<PayloadPath> new_cuda_ipc_path(const Config& config, std::string peer, bool in_process,
                                               std::optional<shm::UnixChannel> fd_channel) {
  int streams = static_cast<int>(std::clamp<int64_t>(config.get_int("cuda_ipc_streams"), 1, 16));
  uint64_t chunk = std::clamp<uint64_t>(config.get_size("cuda_ipc_chunk"), 1ull << 20, 1ull << 30);
  // The lane holds the endpoint's lock while it polls: bounded to small chunks and short waits.
  uint64_t inline_max = std::min<uint64_t>(config.get_size("cuda_ipc_inline_rx"), 1ull << 20);
  auto inline_wait = std::min(config.get_duration("cuda_ipc_inline_wait"), std::chrono::microseconds(1000));
  std::unique_ptr<IpcFdChannel> fds;
  if (fd_channel) fds = std::make_unique<IpcFdChannel>(std::move(*fd_channel), peer);
  return std::make_unique<CudaIpcPath>(std::move(peer), streams, chunk,
                                       config.get_string("cuda_ipc_copy_by") != "destination", in_process, inline_max,
                                       inline_wait, std::move(fds));
}

Result<std::unique_ptr<PayloadPath>> make_cuda_ipc_path(const Config& config, std::string peer, bool in_process,
                                                        std::optional<shm::UnixChannel> fd_channel) {
  DMX_RETURN_IF_ERROR(cuda_ipc_path_available());
  return new_cuda_ipc_path(config, std::move(peer), in_process, std::move(fd_channel));
}

}  // namespace dmx
