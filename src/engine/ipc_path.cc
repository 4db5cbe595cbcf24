// The cuda_ipc payload path: see ipc_path.h for the shape, payload_path.h for the contract.
//
// This file is CUDA-free: it drives the cuda_ipc layer (Exporter, CopyEngine) through its public
// header, which says "built without CUDA" in builds without it.
#include "engine/ipc_path.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/clock.h"
#include "core/log.h"
#include "core/trace.h"
#include "memory/mps.h"

namespace dmx {
namespace {

using cuda_ipc::CopyCompletion;
using cuda_ipc::CopyEngine;
using cuda_ipc::IpcDescriptor;

constexpr auto kSpin = std::chrono::microseconds(200);      // polling after work before the first sleep
constexpr auto kPollSleep = std::chrono::microseconds(20);  // sleeps while copies are pending (plus timer slack)
constexpr auto kStopDrain = std::chrono::seconds(10);       // bound on waiting for copies at stop

inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

class CudaIpcPath final : public PayloadPath {
 public:
  CudaIpcPath(std::string peer, int streams, uint64_t max_chunk, bool copy_by_source, bool in_process)
      : peer_(std::move(peer)),
        streams_(streams),
        max_chunk_(max_chunk),
        copy_by_source_(copy_by_source),
        in_process_(in_process) {}

  ~CudaIpcPath() override {
    stop();
    std::lock_guard lock(join_mu_);
    // Still joinable only when the last owner let go on the path's own thread (keep_alive released
    // after on_path_stopped): that thread is past its last use of *this.
    if (thread_.joinable()) thread_.detach();
  }

  PathKind kind() const override { return PathKind::kCudaIpc; }

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

  Result<std::vector<unsigned char>> post_tx(uint64_t /*seq*/, const MemRegion& src) override {
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
      auto e = exporter_.export_region(src);
      // A region past its allocation is the caller's error; any other refusal (managed memory,
      // stream-ordered pools, cuMem allocations, no driver) means another path must carry it.
      if (!e.ok() && e.status().code() != Code::kOutOfRange)
        return Status(Code::kUnavailable, fmt::format("cuda_ipc cannot export this memory: {}", e.status().message()))
            .with_peer(peer_);
      if (!e.ok()) return e.status().with_peer(peer_);
      d.source = *e;
      d.retired = exporter_.take_retired(kCudaIpcMaxRetired);
    }
    chunks_sent_.fetch_add(1, std::memory_order_relaxed);
    bytes_sent_.fetch_add(src.size, std::memory_order_relaxed);
    return d.encode();
  }

  Result<uint64_t> chunk_length(std::span<const unsigned char> descriptor) override {
    auto d = IpcChunkDescriptor::decode(descriptor);
    if (!d.ok()) return d.status().with_peer(peer_);
    return d->source.length;
  }

  Status post_rx(uint64_t seq, std::span<const unsigned char> descriptor, const MemRegion& dst) override {
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
    std::lock_guard lock(mu_);
    if (stopping_) return closed();
    if (!failed_.ok()) return failed_;
    queue_.push_back(RxItem{seq, std::move(d->source), std::move(d->retired), dst});
    posted_.store(true, std::memory_order_release);
    if (sleeping_) cv_.notify_one();
    return Status();
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
    return s;
  }

  std::string describe() const override {
    std::lock_guard lock(mu_);
    std::string mode = in_process_ ? "in one process (the exporter's pointers, no IPC handles); " : "";
    if (report_.empty()) return "cuda_ipc: " + mode + "no chunk received yet (copy engines start on the first)";
    return "cuda_ipc: " + mode + report_ + shared_note_;
  }

 private:
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

  Status closed() const { return Status(Code::kClosed, "the cuda_ipc path is stopped").with_peer(peer_); }

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
        auto ready = [&] { return stopping_ || !queue_.empty(); };
        if (!ready() && !spinning) {
          if (inflight_.empty()) {
            sleeping_ = true;
            cv_.wait(lock, ready);
            sleeping_ = false;
            if (!stopping_) wakeups_.fetch_add(1, std::memory_order_relaxed);
          } else {
            sleeping_ = true;
            if (cv_.wait_for(lock, kPollSleep, ready) && !stopping_) wakeups_.fetch_add(1, std::memory_order_relaxed);
            sleeping_ = false;
          }
        }
        if (stopping_) break;
        batch.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
        queue_.clear();
        posted_.store(false, std::memory_order_relaxed);  // under mu_: a later post sets it again
      }
      bool worked = !batch.empty();
      if (worked) DMX_TRACE_POINT("ipc.take");
      for (RxItem& item : batch) issue(item, &done);
      if (worked) DMX_TRACE_POINT("ipc.issued");
      batch.clear();
      poll(&done);
      if (!done.empty()) DMX_TRACE_POINT("ipc.copied");
      worked = worked || !done.empty();
      deliver(&done);
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

  void issue(RxItem& item, std::vector<Done>* done) {
    for (uint64_t id : item.retired)
      for (auto& [dev, engine] : engines_) engine->invalidate(peer_, id);
    if (!failure_.ok()) {
      done->push_back({item.seq, failure_});
      return;
    }
    if (item.dst.ptr == nullptr) {  // a dropped chunk: nothing to copy, the sender may release it
      done->push_back({item.seq, Status()});
      return;
    }
    int device = 0;
    if (item.dst.where.kind == MemKind::kCuda) {
      device = item.dst.where.device;
      // cuda_ipc_copy_by=source: the source's GPU, when it is one of ours and reaches the
      // destination's, writes over the peer link instead of the destination's GPU reading.
      auto s = cuda_ipc::device_by_uuid(item.source.device_uuid);
      if (s.ok() && *s == device && !shared_gpu_noted_ && !in_process_) note_shared_gpu(device);
      if (copy_by_source_ && s.ok() && *s != device) {
        auto e = engine_for(*s);
        if (e.ok() && (*e)->can_access_peer(device)) device = *s;
      }
    } else {
      // Host destination: the GPU that owns the source reads it out (a device-to-host copy on its
      // own copy engine); another GPU would pull it over the peer link first.
      auto d = cuda_ipc::device_by_uuid(item.source.device_uuid);
      if (d.ok()) device = *d;
    }
    auto engine = engine_for(device);
    if (!engine.ok()) {
      done->push_back({item.seq, engine.status().with_peer(peer_)});
      return;
    }
    Status s = (*engine)->read(item.seq, item.dst, peer_, item.source, 0);
    if (!s.ok()) {
      done->push_back({item.seq, s.with_peer(peer_)});
      check_device(**engine, s, done);
      return;
    }
    inflight_.emplace(item.seq, Inflight{item.dst.size});
  }

  void poll(std::vector<Done>* done) {
    if (inflight_.empty()) return;
    completions_.clear();
    for (auto& [dev, engine] : engines_) {
      size_t before = completions_.size();
      if (engine->progress(&completions_) == 0) continue;
      for (size_t i = before; i < completions_.size(); ++i)
        if (!completions_[i].status.ok()) {
          check_device(*engine, completions_[i].status, done);
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
        chunks_received_.fetch_add(1, std::memory_order_relaxed);
        bytes_received_.fetch_add(bytes, std::memory_order_relaxed);
        device_copies_.fetch_add(1, std::memory_order_relaxed);
        done->push_back({c.op, Status()});
      } else {
        done->push_back({c.op, !failure_.ok() ? failure_ : c.status.with_peer(peer_)});
      }
    }
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

  // A copy failed: if the device is broken for good (sticky CUDA error), so is the path.
  void check_device(CopyEngine& engine, const Status& why, std::vector<Done>* done) {
    Status sticky = engine.device_error();
    if (sticky.ok() || !failure_.ok()) return;
    failure_ = Status(sticky.code(), fmt::format("cuda_ipc path failed: {} (after: {})", sticky.message(),
                                                 why.message()))
                   .with_peer(peer_);
    DMX_LOG_ERROR("{}", failure_.to_string());
    {
      std::lock_guard lock(mu_);
      failed_ = failure_;
    }
    deliver(done);  // what completed before the failure, with its own status
    if (events_ != nullptr) events_->on_path_failed(PathKind::kCudaIpc, failure_);
  }

  Result<CopyEngine*> engine_for(int device) {
    auto it = engines_.find(device);
    if (it != engines_.end()) return it->second.get();
    auto e = CopyEngine::create({.device = device, .streams = streams_, .in_process = in_process_});
    if (!e.ok()) return e.status();
    CopyEngine* raw = e->get();
    engines_.emplace(device, std::move(*e));
    std::string report;
    for (auto& [dev, engine] : engines_) report += engine->peer_access_report();
    std::lock_guard lock(mu_);
    report_ = std::move(report);
    return raw;
  }

  void deliver(std::vector<Done>* done) {
    if (events_ != nullptr)
      for (Done& d : *done) events_->on_path_rx_done(PathKind::kCudaIpc, d.seq, d.status);
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
    // Copies in flight write into the user's memory: wait for them before saying we are done.
    Deadline deadline = Deadline::after(kStopDrain);
    while (!inflight_.empty() && !deadline.expired()) {
      poll(done);
      deliver(done);
      if (!inflight_.empty()) std::this_thread::sleep_for(kPollSleep);
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
      deliver(done);
    }
    // Drop our mappings of the peer's memory (the engines' import caches close them).
    for (auto& [dev, engine] : engines_)
      if (engine) engine->drop_peer(peer_);
    engines_.clear();
    Events* events = events_;
    std::shared_ptr<void> keep = std::move(keep_alive_);
    if (events != nullptr) events->on_path_stopped(PathKind::kCudaIpc);
    // `keep` goes last: it may own this path, whose destructor then runs here and detaches us.
  }

  const std::string peer_;
  const int streams_;
  const uint64_t max_chunk_;
  const bool copy_by_source_;
  const bool in_process_;

  // Set by start() before the thread runs, read by the thread.
  Events* events_ = nullptr;
  std::shared_ptr<void> keep_alive_;

  std::mutex join_mu_;  // guards thread_, started_
  std::thread thread_;
  bool started_ = false;

  std::mutex tx_mu_;  // guards exporter_
  cuda_ipc::Exporter exporter_;

  mutable std::mutex mu_;  // guards queue_, stopping_, sleeping_, failed_, report_, shared_note_
  std::condition_variable cv_;
  std::deque<RxItem> queue_;
  bool stopping_ = false;
  std::atomic<bool> posted_{false};  // queue_ non-empty or stopping_: the spinning thread looks
  bool sleeping_ = false;
  Status failed_;
  std::string report_;
  std::string shared_note_;  // "; cuda:N is shared with the peer's process ..." once seen

  // Owned by the progress thread.
  std::map<int, std::unique_ptr<CopyEngine>> engines_;  // by local device
  std::unordered_map<uint64_t, Inflight> inflight_;     // by seq (the copy's op)
  std::vector<CopyCompletion> completions_;
  Status failure_;
  bool shared_gpu_noted_ = false;

  std::atomic<uint64_t> chunks_sent_{0}, bytes_sent_{0}, chunks_received_{0}, bytes_received_{0}, device_copies_{0},
      wakeups_{0};
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

std::unique_ptr<PayloadPath> new_cuda_ipc_path(const Config& config, std::string peer, bool in_process) {
  int streams = static_cast<int>(std::clamp<int64_t>(config.get_int("cuda_ipc_streams"), 1, 16));
  uint64_t chunk = std::clamp<uint64_t>(config.get_size("cuda_ipc_chunk"), 1ull << 20, 1ull << 30);
  return std::make_unique<CudaIpcPath>(std::move(peer), streams, chunk,
                                       config.get_string("cuda_ipc_copy_by") != "destination", in_process);
}

Result<std::unique_ptr<PayloadPath>> make_cuda_ipc_path(const Config& config, std::string peer, bool in_process) {
  DMX_RETURN_IF_ERROR(cuda_ipc_path_available());
  return new_cuda_ipc_path(config, std::move(peer), in_process);
}

}  // namespace dmx
