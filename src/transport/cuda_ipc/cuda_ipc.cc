// cuda_ipc with CUDA: legacy IPC handles (cudaIpcGetMemHandle / cudaIpcOpenMemHandle with lazy
// peer access) for cudaMalloc memory, POSIX fds for cuMem allocations (exported here, imported
// and mapped by openers.cc through the driver wrapper in src/memory/cuda/driver.h), copies with cudaMemcpyAsync on
// the lanes of the local GPU from the copy-queue cache (memory/copy_queues.h: non-blocking streams
// on the copy engines), completion by a fence (a pooled event) per copy.
#include "transport/cuda_ipc/cuda_ipc.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "core/log.h"
#include "core/sys.h"
#include "core/trace.h"
#include "memory/backend.h"
#include "memory/copy_queues.h"
#include "memory/cuda/driver.h"
#include "memory/cuda/runtime.h"
#include "memory/cuda/segment_copy.h"
#include "transport/cuda_ipc/openers.h"

namespace dmx::cuda_ipc {
namespace {

using cuda::DeviceGuard;

static_assert(sizeof(cudaIpcMemHandle_t) == IpcDescriptor::kHandleSize);

// How long an engine being destroyed waits for its copies in flight.
constexpr auto kDrainOnDestroy = std::chrono::seconds(10);
// A batch's smallest descriptor buffer: the cuda_ipc path's runs of up to 4,096 pieces of 64 KiB
// (ipc_path.cc kBatchMax) fit, 96 KiB pinned.
constexpr size_t kBatchDescriptors = 4096;
constexpr size_t kBatchStreams = 2;  // streams batched reads take in turn (CopyEngineImpl::batch_streams_)

class CopyEngineImpl final : public CopyEngine {
 public:
  explicit CopyEngineImpl(const Options& o)
      : options_(o),
        opener_(o.device, o.fds),
        cache_(o.in_process ? static_cast<ImportCache::Opener*>(&in_process_opener_) : &opener_) {}
  ~CopyEngineImpl() override {
    // Copies in flight read or write mapped peer memory: wait for them before the mappings close
    // (bounded; the cuda_ipc path waits for its own and leaks a hung device's engines first).
    if (pending() > 0) {
      if (Status s = queues_.drain(Deadline::after(kDrainOnDestroy)); !s.ok()) {
        DMX_LOG_ERROR("cuda_ipc copy engine of cuda:{} destroyed with {} copies in flight: {}", options_.device,
                      pending(), s.to_string());
        if (s.code() == Code::kTimeout) queues_.abandon();  // leaks the streams: never wait on a hung device
      }
    }
    for (auto& q : inflight_)
      for (auto& c : q) cache_.release(c.peer, c.alloc_id);
    end_batches();
  }

  Status init() {
    DMX_RETURN_IF_ERROR(cuda::check_device(options_.device));
    DeviceGuard guard(options_.device);
    DMX_RETURN_IF_ERROR(guard.status());
    int n = 0;
    DMX_CUDA_RETURN_IF_ERROR("cudaGetDeviceCount", -1, cudaGetDeviceCount(&n));
    can_peer_.assign(static_cast<size_t>(n), false);
    for (int d = 0; d < n; ++d) {
      if (d == options_.device) {
        can_peer_[d] = true;
        report_ += fmt::format("cuda:{} -> cuda:{}: same device; ", d, d);
        continue;
      }
      int can = 0;
      cudaError_t err = cudaDeviceCanAccessPeer(&can, options_.device, d);
      if (err != cudaSuccess || !can) {
        report_ += fmt::format("cuda:{} -> cuda:{}: peer access not possible ({}); ", options_.device, d,
                               err != cudaSuccess ? cuda::error_text(err) : "cudaDeviceCanAccessPeer says no");
        continue;
      }
      err = cudaDeviceEnablePeerAccess(d, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
        err = cudaSuccess;
      }
      if (err != cudaSuccess) (void)cudaGetLastError();  // not sticky: clear it
      can_peer_[d] = err == cudaSuccess;
      report_ += err == cudaSuccess ? fmt::format("cuda:{} -> cuda:{}: peer access enabled; ", options_.device, d)
                                    : fmt::format("cuda:{} -> cuda:{}: enabling peer access failed ({}); ",
                                                  options_.device, d, cuda::error_text(err));
    }
    DMX_LOG_INFO("cuda_ipc: {}", report_);
    int lanes = std::clamp(options_.streams, 1, CopyQueues::kMaxLanes);
    for (int i = 0; i < lanes; ++i) {
      DMX_ASSIGN_OR_RETURN(CopyQueue * q, queues_.get(MemSpec{MemKind::kCuda, options_.device}, i));
      lanes_.push_back(q);
    }
    inflight_.resize(lanes_.size());
    return Status();
  }

  Status write(uint64_t op, const MemRegion& local, const std::string& peer, const IpcDescriptor& remote,
               size_t remote_offset) override {
    ++stats_.writes;
    return copy(op, local, peer, remote, remote_offset, /*to_remote=*/true);
  }
  Status read(uint64_t op, const MemRegion& local, const std::string& peer, const IpcDescriptor& remote,
              size_t remote_offset) override {
    ++stats_.reads;
    return copy(op, local, peer, remote, remote_offset, /*to_remote=*/false);
  }

  Status read_lists(std::span<const ListRead> lists, const std::string& peer) override {
    if (lists.empty()) return Status();
    // gpu_push asks for each small copy to be pushed on its lane (ordered with that lane's copy-engine
    // copies): the batch kernel is not asked to take them.
    if (options_.push_max > 0) return Status(Code::kUnavailable, "cuda_ipc batch: gpu push copies each small chunk");
    size_t pieces = 0;
    for (const ListRead& l : lists) {
      // The kernel loads the source itself: its GPU must be this one or a peer this one reaches (a
      // copy engine would stage through the host where P2P is off).
      Result<int> source = device_by_uuid(l.remote->device_uuid);
      if (!source.ok() || !can_access_peer(*source))
        return Status(Code::kUnavailable, fmt::format("cuda_ipc batch: cuda:{} cannot load the source's memory",
                                                      options_.device));
      for (const ListPiece& p : l.pieces) {
        if (p.local.size > 0 && (p.local.where.kind != MemKind::kCuda || !can_access_peer(p.local.where.device)))
          return Status(Code::kUnavailable, fmt::format("cuda_ipc batch: cuda:{} cannot write {} memory",
                                                        options_.device, to_string(p.local.where)));
        if (p.remote_offset > l.remote->length || p.local.size > l.remote->length - p.remote_offset)
          return Status(Code::kOutOfRange, fmt::format("cuda_ipc: [{}, +{}) is outside the peer's {} B region",
                                                       p.remote_offset, p.local.size, l.remote->length))
              .with_peer(peer);
        pieces += (p.local.size + cuda::kSegmentPiece - 1) / cuda::kSegmentPiece;
      }
    }
    DeviceGuard guard(options_.device);
    DMX_RETURN_IF_ERROR(guard.status());
    cudaStream_t& stream = batch_streams_[next_batch_stream_];
    if (stream == nullptr)
      DMX_CUDA_RETURN_IF_ERROR("cudaStreamCreateWithFlags(batch)", options_.device,
                               cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    Batch b = take_spare_batch(pieces);
    auto give_back = [&](Batch& x) {
      for (Copy& c : x.copies) cache_.release(c.peer, c.alloc_id);
      x.copies.clear();
      spare_batches_.push_back(std::move(x));
    };
    if (b.cap < pieces) {  // a new one, pinned and mapped: the kernel reads the descriptors from host memory
      DMX_TRACE_POINT("ipc.b.grow");
      const size_t cap = std::bit_ceil(std::max(pieces, kBatchDescriptors));
      cudaError_t e = cudaHostAlloc(reinterpret_cast<void**>(&b.descs), cap * sizeof(cuda::SegmentCopy),
                                    cudaHostAllocPortable | cudaHostAllocMapped);
      if (e != cudaSuccess)
        return Status(Code::kResourceExhausted,
                      fmt::format("cuda_ipc batch: cudaHostAlloc of {} descriptors: {}", cap, cuda::error_text(e)));
      b.cap = cap;
      ++stats_.list_buffers;
    }
    if (b.done == nullptr) {
      cudaError_t e = cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming);
      if (e != cudaSuccess) {
        spare_batches_.push_back(std::move(b));
        return Status(Code::kInternal, fmt::format("cuda_ipc batch: cudaEventCreate: {}", cuda::error_text(e)));
      }
    }
    DMX_TRACE_POINT("ipc.b.ready");
    size_t n = 0;
    uint64_t bytes = 0;
    for (const ListRead& l : lists) {
      Result<void*> base = cache_.acquire(peer, *l.remote);  // once per list
      if (!base.ok()) {
        give_back(b);
        return base.status();
      }
      b.copies.push_back(Copy{l.op, 0, peer, l.remote->alloc_id});
      auto from = reinterpret_cast<uint64_t>(static_cast<char*>(*base) + l.remote->offset);
      for (const ListPiece& p : l.pieces) {
        n += cuda::split_segment(from + p.remote_offset, reinterpret_cast<uint64_t>(p.local.ptr), p.local.size,
                                 b.descs + n);
        bytes += p.local.size;
        if (p.local.size > 0 && p.local.where.device != l.remote->device) ++stats_.peer_copies;
      }
    }
    DMX_TRACE_POINT("ipc.b.filled");
    void* on_device = nullptr;
    cudaError_t e = cudaHostGetDevicePointer(&on_device, b.descs, 0);
    Status s = e == cudaSuccess ? Status()
                                : Status(Code::kInternal, fmt::format("cuda_ipc batch: cudaHostGetDevicePointer: {}",
                                                                      cuda::error_text(e)));
    if (s.ok()) s = cuda::launch_segment_copy(static_cast<const cuda::SegmentCopy*>(on_device), n, stream);
    DMX_TRACE_POINT("ipc.b.launched");
    if (s.ok() && (e = cudaEventRecord(b.done, stream)) != cudaSuccess)
      s = Status(Code::kInternal, fmt::format("cuda_ipc batch: cudaEventRecord: {}", cuda::error_text(e)));
    if (!s.ok()) {
      give_back(b);
      return Status(s.code(), fmt::format("cuda_ipc batched read of {} lists, peer {}: {}", lists.size(), peer,
                                          s.message()));
    }
    stats_.reads += lists.size();
    stats_.bytes += bytes;
    batches_.push_back(std::move(b));
    next_batch_stream_ = (next_batch_stream_ + 1) % kBatchStreams;
    return Status();
  }

  size_t progress(std::vector<CopyCompletion>* out) override {
    size_t before = out->size();
    while (!batches_.empty()) {  // an event query needs no current device
      Batch& b = batches_.front();
      cudaError_t e = cudaEventQuery(b.done);
      if (e == cudaErrorNotReady) break;
      Status s;
      if (e != cudaSuccess) s = Status(Code::kInternal, "cuda_ipc batched copy: " + cuda::error_text(e));
      for (Copy& c : b.copies) {
        out->push_back(CopyCompletion{c.op, s.ok() ? Status() : Status(s).with_peer(c.peer)});
        cache_.release(c.peer, c.alloc_id);
      }
      b.copies.clear();
      spare_batches_.push_back(std::move(b));
      batches_.pop_front();
    }
    // A lane's done() sets no device (querying an event needs none): this is the hot path.
    for (size_t i = 0; i < lanes_.size(); ++i) {
      std::deque<Copy>& q = inflight_[i];
      while (!q.empty()) {
        Copy& c = q.front();
        Result<bool> done = lanes_[i]->done(c.fence);
        if (done.ok() && !*done) break;
        Status s;
        if (!done.ok()) s = Status(done.status().code(), "cuda_ipc copy: " + done.status().message()).with_peer(c.peer);
        out->push_back(CopyCompletion{c.op, std::move(s)});
        cache_.release(c.peer, c.alloc_id);
        q.pop_front();
      }
    }
    return out->size() - before;
  }

  Status wait(Deadline deadline) override {
    if (pending() == 0) return Status();
    for (;;) {
      if (!batches_.empty() && cudaEventQuery(batches_.front().done) != cudaErrorNotReady) return Status();
      for (size_t i = 0; i < lanes_.size(); ++i) {
        if (inflight_[i].empty()) continue;
        Result<bool> done = lanes_[i]->done(inflight_[i].front().fence);
        if (!done.ok() || *done) return Status();  // progress() reports it
      }
      if (deadline.expired()) return Status(Code::kTimeout, "cuda_ipc wait: no copy completed by the deadline");
      cpu_relax();
    }
  }

  size_t pending() const override {
    size_t n = 0;
    for (auto& q : inflight_) n += q.size();
    for (auto& b : batches_) n += b.copies.size();
    return n;
  }
  Status device_error() override {
    for (CopyQueue* lane : lanes_) DMX_RETURN_IF_ERROR(lane->device_error());
    return Status();
  }
  void invalidate(const std::string& peer, uint64_t alloc_id) override { cache_.invalidate(peer, alloc_id); }
  void drop_peer(const std::string& peer) override { cache_.drop_peer(peer); }
  std::string peer_access_report() const override { return report_; }
  bool can_access_peer(int d) const override { return d >= 0 && static_cast<size_t>(d) < can_peer_.size() && can_peer_[d]; }
  CopyStats stats() const override { return stats_; }
  const ImportCache::Stats& cache_stats() const override { return cache_.stats(); }

 private:
  struct Copy {
    uint64_t op;
    uint64_t fence;  // of its lane, recorded right after the copy (0 in a Batch)
    std::string peer;
    uint64_t alloc_id;
  };
  // One read_lists: its descriptors (pinned, mapped), the event after its kernel, its copies.
  // Kept for reuse once done (spare_batches_).
  struct Batch {
    cudaEvent_t done = nullptr;
    cuda::SegmentCopy* descs = nullptr;
    size_t cap = 0;  // descriptors descs holds
    std::vector<Copy> copies;
  };

  // The smallest spare batch that holds `pieces` descriptors, or an empty one (no buffer yet);
  // sizes rounded up and kept, as the CUDA queue's list buffers are (ListCopier::take). A spare is
  // never freed to make room for a larger one: cudaFreeHost waits for the whole device, so the
  // next launch waited for the kernels in flight (13-157 us a batch on one H200,
  // docs/performance.md). Spares stay until the engine goes: as many as were ever in flight.
  Batch take_spare_batch(size_t pieces) {
    auto fit = spare_batches_.end();
    for (auto it = spare_batches_.begin(); it != spare_batches_.end(); ++it)
      if (it->cap >= pieces && (fit == spare_batches_.end() || it->cap < fit->cap)) fit = it;
    if (fit == spare_batches_.end()) return Batch{};
    std::swap(*fit, spare_batches_.back());
    Batch b = std::move(spare_batches_.back());
    spare_batches_.pop_back();
    return b;
  }

  // The destructor's: waits (bounded) for batches in flight, whose kernels use the mappings and
  // the pinned descriptors, then frees what they hold; a hung device's are leaked.
  void end_batches() {
    Deadline deadline = Deadline::after(kDrainOnDestroy);
    auto running = [&] {  // the streams run side by side: any batch may be the last to finish
      return std::any_of(batches_.begin(), batches_.end(),
                         [](const Batch& b) { return cudaEventQuery(b.done) == cudaErrorNotReady; });
    };
    while (running() && !deadline.expired()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (running()) {
      DMX_LOG_ERROR("cuda_ipc copy engine of cuda:{} destroyed with {} batched reads in flight", options_.device,
                    batches_.size());
      return;  // leaked, as the lanes' streams are
    }
    for (Batch& b : batches_) {
      for (Copy& c : b.copies) cache_.release(c.peer, c.alloc_id);
      spare_batches_.push_back(std::move(b));
    }
    batches_.clear();
    for (Batch& b : spare_batches_) {
      if (b.descs != nullptr) (void)cudaFreeHost(b.descs);
      if (b.done != nullptr) (void)cudaEventDestroy(b.done);
    }
    spare_batches_.clear();
    for (cudaStream_t stream : batch_streams_)
      if (stream != nullptr) (void)cudaStreamDestroy(stream);
  }

  Status copy(uint64_t op, const MemRegion& local, const std::string& peer, const IpcDescriptor& remote,
              size_t remote_offset, bool to_remote) {
    if (remote_offset > remote.length || local.size > remote.length - remote_offset)
      return Status(Code::kOutOfRange, fmt::format("cuda_ipc: [{}, +{}) is outside the peer's {} B region",
                                                   remote_offset, local.size, remote.length))
          .with_peer(peer);
    if (local.where.kind == MemKind::kSim)
      return Status(Code::kInvalidArgument, "cuda_ipc: simulated device memory cannot take part in CUDA copies");
    DMX_TRACE_POINT("ce.copy");
    DeviceGuard guard(options_.device);
    DMX_RETURN_IF_ERROR(guard.status());
    DMX_TRACE_POINT("ce.guard");
    DMX_ASSIGN_OR_RETURN(void* base, cache_.acquire(peer, remote));
    char* remote_ptr = static_cast<char*>(base) + remote.offset + remote_offset;
    size_t i = next_lane_++ % lanes_.size();
    CopyQueue* lane = lanes_[i];
    void* dst = to_remote ? static_cast<void*>(remote_ptr) : local.ptr;
    const void* src = to_remote ? static_cast<const void*>(local.ptr) : remote_ptr;
    DMX_TRACE_POINT("ce.acquired");
    Status s;
    bool pushed = false;
    if (local.size > 0 && local.size <= options_.push_max) {
      s = lane->push(dst, src, local.size);
      pushed = s.ok();
      if (s.code() == Code::kUnavailable) {
        if (!push_refusal_logged_) {
          push_refusal_logged_ = true;
          DMX_LOG_INFO("cuda_ipc to {}: a small copy goes by the copy engine, not pushed: {}", peer, s.message());
        }
        s = Status();
      }
    }
    if (!pushed && s.ok()) s = lane->copy(dst, src, local.size);  // 0 bytes: no copy, the fence completes the op
    DMX_TRACE_POINT("ce.memcpy");
    uint64_t fence = 0;
    if (s.ok()) {
      Result<uint64_t> f = lane->record();
      if (f.ok()) fence = *f;
      else s = f.status();
    }
    DMX_TRACE_POINT("ce.recorded");
    if (!s.ok()) {
      cache_.release(peer, remote.alloc_id);
      return Status(s.code(), fmt::format("cuda_ipc {} of {} B, peer {}: {}", to_remote ? "write" : "read", local.size,
                                          peer, s.message()));
    }
    stats_.bytes += local.size;
    if (pushed) ++stats_.pushes;
    if (local.where.kind == MemKind::kCuda && local.where.device != remote.device) ++stats_.peer_copies;
    inflight_[i].push_back(Copy{op, fence, peer, remote.alloc_id});
    return Status();
  }

  Options options_;
  detail::CudaOpener opener_;
  detail::InProcessOpener in_process_opener_;
  ImportCache cache_;
  // After cache_: the lanes are destroyed (their streams) before the mappings close.
  CopyQueues queues_;                       // lanes 0..streams-1 of (cuda, options_.device)
  std::vector<CopyQueue*> lanes_;           // from queues_, in lane order
  std::vector<std::deque<Copy>> inflight_;  // per lane, in submission order
  // read_lists' kernels, a batch on each stream in turn (made on first use): a batch's kernel
  // starts while the one before drains its last warps, where one stream runs them back to back
  // (segment_copy_bench, 64 KiB blocks a table a launch on one H200: 0.50 of contiguous on one
  // stream, 0.70 on two). In the engine it gained nothing on one GPU; two GPUs are not measured
  // (docs/performance.md).
  cudaStream_t batch_streams_[kBatchStreams] = {};
  size_t next_batch_stream_ = 0;
  std::deque<Batch> batches_;               // in flight, in submission order
  std::vector<Batch> spare_batches_;
  std::vector<bool> can_peer_;
  size_t next_lane_ = 0;
  bool push_refusal_logged_ = false;
  std::string report_;
  CopyStats stats_;
};

}  // namespace

Status available() {
  auto n = cuda::device_count();
  if (!n.ok()) return Status(Code::kUnavailable, fmt::format("cuda_ipc: {}", n.status().message()));
  return Status();
}

Result<int> device_by_uuid(const std::array<uint8_t, 16>& uuid) {
  DMX_ASSIGN_OR_RETURN(int n, cuda::device_count());
  static std::mutex mu;
  static std::vector<std::array<uint8_t, 16>> uuids;  // by ordinal; filled once (properties are slow)
  std::lock_guard lock(mu);
  if (uuids.empty()) {
    for (int d = 0; d < n; ++d) {
      cudaDeviceProp prop{};
      std::array<uint8_t, 16> u{};
      if (cudaGetDeviceProperties(&prop, d) == cudaSuccess) std::memcpy(u.data(), &prop.uuid, u.size());
      uuids.push_back(u);
    }
  }
  for (size_t d = 0; d < uuids.size(); ++d)
    if (uuids[d] == uuid && uuid != std::array<uint8_t, 16>{}) return static_cast<int>(d);
  return Status(Code::kNotFound, "cuda_ipc: no visible GPU has the descriptor's uuid");
}

Result<IpcDescriptor> Exporter::export_region(const MemRegion& region) {
  if (region.where.kind != MemKind::kCuda)
    return Status(Code::kInvalidArgument, fmt::format("cuda_ipc export: {} memory is not CUDA device memory",
                                                      to_string(region.where)));
  DMX_RETURN_IF_ERROR(available());
  auto addr = reinterpret_cast<uintptr_t>(region.ptr);
  // Fast path (every small message): the GTLB names a cached allocation that holds the region, and
  // it is still the same allocation (its buffer id, which any pointer inside it reports): one
  // driver call.
  if (auto hit = gtlb_.lookup(addr, region.size)) {
    DMX_ASSIGN_OR_RETURN(uint64_t id, cuda::driver::buffer_id(region.ptr));
    if (id == hit->generation) {
      IpcDescriptor d = reinterpret_cast<const Entry*>(hit->value)->desc;
      d.offset = addr - hit->base;
      d.length = region.size;
      return d;
    }
  }
  // For a cuMem allocation the range is its block's mapping (memory/cuda/driver.h).
  DMX_ASSIGN_OR_RETURN(cuda::driver::AllocationRange range, cuda::driver::allocation_range(region.ptr));
  if (addr < range.base || addr - range.base > range.size)
    return Status(Code::kInternal, fmt::format("cuda_ipc export: the driver placed {} in [0x{:x}, +{})", region.ptr,
                                               range.base, range.size));
  // The driver's buffer id tells a live allocation from one freed and allocated again at the same
  // base (cudaMalloc readily returns the same address): a stale handle must never be sent.
  DMX_ASSIGN_OR_RETURN(uint64_t buffer_id, cuda::driver::buffer_id(reinterpret_cast<void*>(range.base)));
  auto it = by_base_.find(range.base);
  if (it != by_base_.end() && (it->second.buffer_id != buffer_id || it->second.desc.alloc_size != range.size)) {
    retire(it);
    it = by_base_.end();
  }
  if (it == by_base_.end()) {
    DMX_ASSIGN_OR_RETURN(IpcDescriptor d, describe_new(range.base, range.size, range.device));
    it = by_base_.emplace(range.base, Entry{d, buffer_id}).first;
    detail::add_in_process_export(d.alloc_id, range.base, range.size, buffer_id);
  }
  // Entries stay where they are in the map until retired or forgotten, which invalidate them here.
  gtlb_.fill(GtlbEntry{range.base, range.size, buffer_id, reinterpret_cast<uint64_t>(&it->second)}, addr,
             std::min<uint64_t>(region.size, range.size - (addr - range.base)));
  IpcDescriptor d = it->second.desc;
  d.offset = addr - range.base;
  d.length = region.size;
  if (region.size > range.size - d.offset) {
    if (d.kind == IpcDescriptor::Kind::kIpcHandle)
      return Status(Code::kOutOfRange, fmt::format("cuda_ipc export: [{}, +{}) runs past its allocation of {} B",
                                                   region.ptr, region.size, range.size));
    d.length = range.size - d.offset;  // the rest lies in the next block
  }
  return d;
}

void Exporter::retire(std::map<uintptr_t, Entry>::iterator it) {
  if (retired_.size() >= kMaxRetired) {
    DMX_LOG_WARN(
        "cuda_ipc export: {} freed allocations not yet announced to the peer; forgetting the oldest "
        "(its peer keeps that mapping until it drops us)",
        retired_.size());
    retired_.erase(retired_.begin());
  }
  retired_.push_back(it->second.desc.alloc_id);
  detail::remove_in_process_export(it->second.desc.alloc_id);
  gtlb_.invalidate(it->first, it->second.desc.alloc_size);
  by_base_.erase(it);
}

size_t Exporter::sweep(size_t max) {
  size_t retired = 0;
  size_t n = std::min(max, by_base_.size());  // each entry at most once per call
  auto it = by_base_.lower_bound(sweep_from_);
  for (size_t i = 0; i < n; ++i) {
    if (it == by_base_.end()) it = by_base_.begin();
    // Any pointer inside the allocation reports its buffer id; a freed one is not CUDA memory (or
    // belongs to whatever was allocated there since).
    auto id = cuda::driver::buffer_id(reinterpret_cast<void*>(it->first));
    if (!id.ok() || *id != it->second.buffer_id) {
      auto next = std::next(it);
      retire(it);
      it = next;
      ++retired;
    } else {
      ++it;
    }
  }
  sweep_from_ = it == by_base_.end() ? 0 : it->first;
  return retired;
}

Result<IpcDescriptor> Exporter::describe_new(uintptr_t base, uint64_t size, int device) {
  DeviceGuard guard(device);
  DMX_RETURN_IF_ERROR(guard.status());
  IpcDescriptor d;
  cudaIpcMemHandle_t h;
  cudaError_t err = cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base));
  if (err == cudaSuccess) {
    std::memcpy(d.handle.data(), &h, sizeof h);
  } else {
    (void)cudaGetLastError();  // not sticky: clear it
    Status cumem = cuda::driver::cumem_fd_exportable(reinterpret_cast<void*>(base));
    if (!cumem.ok())
      return Status(Code::kUnavailable,
                    fmt::format("cudaIpcGetMemHandle: {}; and {}", cuda::error_text(err), cumem.message()));
    d.kind = IpcDescriptor::Kind::kCuMemFd;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
    std::memcpy(d.device_uuid.data(), &prop.uuid, d.device_uuid.size());
  d.device = device;
  d.owner_pid = ::getpid();
  d.alloc_id = detail::next_alloc_id();
  d.alloc_size = size;
  return d;
}

Result<UniqueFd> Exporter::export_fd(uint64_t alloc_id) {
  for (const auto& [base, e] : by_base_)
    if (e.desc.alloc_id == alloc_id) {
      if (e.desc.kind != IpcDescriptor::Kind::kCuMemFd)
        return Status(Code::kInvalidArgument, fmt::format("cuda_ipc: allocation {} is shared by an IPC handle, "
                                                          "not an fd",
                                                          alloc_id));
      return cuda::driver::export_cumem_fd(reinterpret_cast<void*>(base));
    }
  return Status(Code::kNotFound, fmt::format("cuda_ipc: allocation {} is not exported (freed meanwhile?)", alloc_id));
}

Result<uint64_t> Exporter::forget(const void* ptr) {
  auto addr = reinterpret_cast<uintptr_t>(ptr);
  auto it = by_base_.upper_bound(addr);
  if (it == by_base_.begin()) return Status(Code::kNotFound, fmt::format("cuda_ipc forget: {} was never exported", ptr));
  --it;
  if (addr - it->first >= it->second.desc.alloc_size)
    return Status(Code::kNotFound, fmt::format("cuda_ipc forget: {} was never exported", ptr));
  uint64_t id = it->second.desc.alloc_id;
  detail::remove_in_process_export(id);
  gtlb_.invalidate(it->first, it->second.desc.alloc_size);
  by_base_.erase(it);
  return id;
}

Exporter::~Exporter() {
  for (auto& [base, e] : by_base_) detail::remove_in_process_export(e.desc.alloc_id);
}

Result<std::unique_ptr<CopyEngine>> CopyEngine::create(const Options& options) {
  DMX_RETURN_IF_ERROR(available());
  auto engine = std::make_unique<CopyEngineImpl>(options);
  DMX_RETURN_IF_ERROR(engine->init());
  return std::unique_ptr<CopyEngine>(std::move(engine));
}

Result<std::unique_ptr<MappedWindow>> MappedWindow::open(const IpcDescriptor& desc, int device) {
  if (desc.kind != IpcDescriptor::Kind::kIpcHandle)
    return Status(Code::kUnavailable, "a device window must be cudaMalloc memory (a legacy IPC handle); this is a cuMem "
                                      "allocation");
  if (desc.owner_pid == ::getpid())
    return Status(Code::kUnavailable, "a device window names this process: CUDA IPC cannot map it here (a kernel of "
                                      "this process can store to the memory itself)");
  DMX_ASSIGN_OR_RETURN(void* base, detail::open_ipc_mapping(desc, device));
  return std::unique_ptr<MappedWindow>(new MappedWindow(base, desc.offset, desc.length));
}

MappedWindow::~MappedWindow() { detail::close_ipc_mapping(base_); }

}  // namespace dmx::cuda_ipc
