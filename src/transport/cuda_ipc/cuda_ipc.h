// dmx cuda_ipc transport: GPU memory of one process read and written by another process of the
// same host, over NVLink or PCIe P2P (or within one GPU shared by two processes), on the copy
// engines, with no host memory on the payload path.
//
// The IPC layer's header (the engine sees the transport through cuda_ipc_transport.h; tests also
// reach into ipc_path.h and ipc_fds.h). It compiles without CUDA; then available() and
// CopyEngine::create() say "built without CUDA".
//
// Pieces:
//  - IpcDescriptor: what an owner sends to a peer (over the engine's control channel) so the peer
//    can map a region of its device memory: how the allocation is shared (a CUDA IPC handle of the
//    whole cudaMalloc allocation, or — for a cuMem allocation, e.g. PyTorch's expandable segments —
//    a POSIX fd that travels beside the descriptors, over a Unix socket: FdSource), an allocation
//    id, and the region's offset and length within the allocation. decode() treats the bytes as
//    untrusted.
//  - Exporter: makes descriptors; one IPC handle per allocation, made once and cached (making a
//    handle synchronises); forget() when the owner frees, which yields the invalidation to send.
//    A cuMem allocation is one physical block mapped at one place: a region that runs on into the
//    next block (contiguous addresses, another allocation) is described up to its block's end, and
//    the caller describes the rest separately.
//  - ImportCache: (peer, allocation id) -> mapped base, with invalidation and peer drop; mappings
//    in use by copies in flight are closed only after those copies complete. CUDA-free logic
//    (the opener is an interface), so it is tested on machines without GPUs.
//  - CopyEngine: one-sided write (local -> peer region) and read (peer region -> local) at any
//    offset and length inside the described region, several copies in flight, on lanes of the
//    local GPU taken from the copy-queue cache (memory/copy_queues.h: a non-blocking stream each,
//    no thread) with a fence per copy; completion by progress() polling.
//  - In one process (Options::in_process): CUDA cannot open an IPC handle in the process that made
//    it, and needs none: the engine resolves a descriptor to the exporter's own pointer through a
//    process-wide table of this process's exports (allocation ids are unique per process), checking
//    that the allocation is still the one exported (its driver buffer id). The caller must have
//    proven that the peer is this process (the engine does, with the kernel's SO_PEERCRED).
//
// Threading: Exporter, ImportCache and CopyEngine do not lock; each is used by one thread at a time
// (the engine's cuda_ipc path serialises its callers: its progress thread and, for small chunks,
// the control stream's worker, under the path's engine_mu_). Errors: Status values; a copy's
// failure fails that copy only, and a device error (sticky in CUDA) fails the engine.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/sys.h"
#include "dmx/memory.h"
#include "dmx/status.h"
#include "memory/gtlb.h"

namespace dmx::cuda_ipc {

// Whether cuda_ipc can work in this process (CUDA build, driver, at least one device), or why not.
Status available();

struct IpcDescriptor {
  static constexpr size_t kHandleSize = 64;  // sizeof(cudaIpcMemHandle_t)
  static constexpr size_t kWireSize = 8 + 4 + 4 + kHandleSize + 16 + 8 * 4 + 8;

  // How the peer maps the allocation.
  enum class Kind : uint32_t {
    kIpcHandle = 1,  // cudaMalloc memory: `handle` is its cudaIpcMemHandle_t
    kCuMemFd = 2,    // a cuMem allocation: its POSIX fd comes by the side channel (FdSource); no handle
  };
  Kind kind = Kind::kIpcHandle;
  std::array<uint8_t, kHandleSize> handle{};  // cudaIpcMemHandle_t of the allocation (kIpcHandle)
  std::array<uint8_t, 16> device_uuid{};      // of the owner's GPU (cudaDeviceProp::uuid)
  int32_t device = -1;                        // the owner's ordinal (informational only)
  int32_t owner_pid = 0;
  uint64_t alloc_id = 0;    // unique in the owner process (never reused)
  uint64_t alloc_size = 0;  // bytes of the whole allocation
  uint64_t offset = 0;      // of the region inside the allocation
  uint64_t length = 0;      // of the region

  std::vector<std::byte> encode() const;
  // Validates everything: magic, version, kind, size, offset + length <= alloc_size (no overflow).
  static Result<IpcDescriptor> decode(std::span<const std::byte> bytes);
};

// Where an importer finds the POSIX fd of a peer's cuMem allocation (Kind::kCuMemFd), which the
// owner sends over a Unix socket before the first descriptor that names it. The engine's cuda_ipc
// path implements it over its side channel (transport/cuda_ipc/ipc_fds.h).
class FdSource {
 public:
  virtual ~FdSource() = default;
  // The fd of allocation `alloc_id` of the peer; borrowed: it stays open until the owner retires
  // that allocation (ImportCache::invalidate) or the source goes away.
  virtual Result<int> fd_for(uint64_t alloc_id) = 0;
};

class Exporter {
 public:
  Exporter() = default;
  Exporter(const Exporter&) = delete;
  Exporter& operator=(const Exporter&) = delete;
  ~Exporter();  // its entries leave the process-wide table of exports (in-process peers)

  // A descriptor for `region` (MemKind::kCuda). The allocation's IPC handle is made on first use.
  // A cached entry is trusted only while the driver's buffer id of the allocation is the one it was
  // made for: memory freed and allocated again at the same base (same size or not) gets a new
  // handle and a new allocation id, and the old id goes to the retired list (take_retired).
  // cudaMalloc memory: a region past its allocation is kOutOfRange. A cuMem allocation (kind
  // kCuMemFd) may end inside the region: the descriptor then covers [region.ptr, block end) and its
  // length says so. Memory neither way can share (managed, pools, cuMem without the POSIX fd
  // handle type): an error with both reasons.
  Result<IpcDescriptor> export_region(const MemRegion& region);
  // A new POSIX fd for exported allocation `alloc_id` (kind kCuMemFd), for the peer.
  Result<UniqueFd> export_fd(uint64_t alloc_id);
  // The allocation holding `ptr` is about to be freed: drop its handle. Returns the allocation id
  // the peers must invalidate (kNotFound when it was never exported).
  Result<uint64_t> forget(const void* ptr);
  // Ids of allocations export_region or sweep found freed, oldest first, at most `max`; the peers
  // must invalidate them. Removed from the list.
  std::vector<uint64_t> take_retired(size_t max);
  // Looks at up to `max` cached allocations (round robin over calls) and retires those freed since
  // they were exported: the address is no longer CUDA memory, or holds another allocation (a new
  // buffer id). Without it an allocation that is freed and never exported again would stay
  // mapped — and its memory alive — in the peer until the connection ends. Returns how many it
  // retired.
  size_t sweep(size_t max);
  size_t exported() const { return by_base_.size(); }
  GtlbCounters translations() const { return gtlb_.counters(); }
  size_t retired() const { return retired_.size(); }
  static constexpr size_t kMaxRetired = 4096;  // beyond this the oldest is dropped (and logged)

 private:
  struct Entry {
    IpcDescriptor desc;      // offset/length unset
    uint64_t buffer_id = 0;  // CU_POINTER_ATTRIBUTE_BUFFER_ID when the handle was made
  };
  // The descriptor of a new export of the allocation [base, +size) on `device`.
  Result<IpcDescriptor> describe_new(uintptr_t base, uint64_t size, int device);
  // Moves a cached entry to the retired list (and out of the in-process table).
  void retire(std::map<uintptr_t, Entry>::iterator it);

  std::map<uintptr_t, Entry> by_base_;  // allocation base -> entry
  Gtlb gtlb_;  // address -> the entry holding it (value: the Entry's address); see export_region
  std::vector<uint64_t> retired_;
  uintptr_t sweep_from_ = 0;  // where the next sweep starts
};

// The ordinal of the local GPU whose uuid is `uuid` (as IpcDescriptor::device_uuid), kNotFound when
// no visible GPU has it. Cached per process after the first call.
Result<int> device_by_uuid(const std::array<uint8_t, 16>& uuid);

class ImportCache {
 public:
  // Opens and closes mappings (the CUDA one wraps cudaIpcOpenMemHandle / cudaIpcCloseMemHandle).
  class Opener {
   public:
    virtual ~Opener() = default;
    virtual Result<void*> open(const IpcDescriptor& desc) = 0;
    virtual void close(void* base) = 0;
  };
  struct Stats {
    uint64_t hits = 0, misses = 0, invalidations = 0, closes = 0;
  };

  explicit ImportCache(Opener* opener) : opener_(opener) {}
  ~ImportCache();  // closes every mapping (callers make sure no copy is in flight)
  ImportCache(const ImportCache&) = delete;
  ImportCache& operator=(const ImportCache&) = delete;

  // Pins the mapping of (peer, desc.alloc_id), opening it on a miss; returns its base. A cached
  // entry whose handle or size differs from `desc` (the id was reused) is replaced. Every acquire
  // is paired with one release once the copy using it has completed.
  Result<void*> acquire(const std::string& peer, const IpcDescriptor& desc);
  void release(const std::string& peer, uint64_t alloc_id);
  // The owner freed the allocation: close the mapping (at once, or after its last release).
  void invalidate(const std::string& peer, uint64_t alloc_id);
  // The peer went away: invalidate all its mappings.
  void drop_peer(const std::string& peer);

  size_t size() const { return entries_.size(); }
  const Stats& stats() const { return stats_; }

 private:
  struct Entry {
    void* base = nullptr;
    IpcDescriptor::Kind kind = IpcDescriptor::Kind::kIpcHandle;
    std::array<uint8_t, IpcDescriptor::kHandleSize> handle{};
    uint64_t alloc_size = 0;
    uint32_t in_use = 0;
    bool stale = false;  // invalidated while in use: close at the last release
  };
  using Key = std::pair<std::string, uint64_t>;
  void close_entry(std::map<Key, Entry>::iterator it);

  Opener* opener_;
  std::map<Key, Entry> entries_;
  Stats stats_;
};

// A peer's region mapped into this process for kernels that store into it themselves (direct
// puts, dmx/device.cuh; docs/gpu-push.md), from the descriptor the owner's Exporter made. Legacy IPC
// handles only (cudaMalloc memory; a cuMem fd would need the side channel), and only from another
// process. The mapping is shared with the copy engines' (one per handle in the process) and
// closed when the last user lets go. Thread-safe (the process-wide table locks).
class MappedWindow {
 public:
  // Maps `desc` (untrusted: decoded and checked by IpcDescriptor::decode; the handle's size is
  // checked against the driver's) for `device`'s kernels, peer access enabled as needed.
  static Result<std::unique_ptr<MappedWindow>> open(const IpcDescriptor& desc, int device);
  ~MappedWindow();
  MappedWindow(const MappedWindow&) = delete;
  MappedWindow& operator=(const MappedWindow&) = delete;
  void* data() const { return static_cast<char*>(base_) + offset_; }  // the region's first byte
  uint64_t size() const { return size_; }

 private:
  MappedWindow(void* base, uint64_t offset, uint64_t size) : base_(base), offset_(offset), size_(size) {}
  void* base_;  // the allocation's mapping
  uint64_t offset_, size_;
};

struct CopyCompletion {
  uint64_t op = 0;
  Status status;
};

struct CopyStats {
  uint64_t writes = 0, reads = 0, bytes = 0;
  uint64_t peer_copies = 0;  // between two different GPUs (NVLink / PCIe P2P)
  uint64_t pushes = 0;       // of those copies, made by the SMs (GPU push), not a copy engine
  uint64_t list_buffers = 0;  // pinned descriptor buffers batched reads allocated (kept for reuse)
};

// Copies between local memory and peers' exported device memory.
class CopyEngine {
 public:
  struct Options {
    int device = 0;   // the local GPU that issues the copies (its streams)
    int streams = 2;  // lanes (1..16), round-robin; copies on one lane complete in order
    // The peer is this process: descriptors resolve to the exporter's pointers (see the top of
    // this file), and a descriptor from another process is refused.
    bool in_process = false;
    // The peer's cuMem fds (outlives the engine); null: cuMem descriptors fail with the reason.
    FdSource* fds = nullptr;
    // GPU push (docs/gpu-push.md): copies of 1..push_max bytes are made by the device's SMs
    // (CopyQueue::push) when it can reach both ends, else by a copy engine. 0: never.
    uint64_t push_max = 0;
  };
  virtual ~CopyEngine() = default;
  // Enables peer access from `device` to every GPU that supports it (logged once with the reason
  // when not) and takes its lanes from its copy-queue cache.
  static Result<std::unique_ptr<CopyEngine>> create(const Options& options);

  // One-sided: copy `local` (cuda, pinned or host memory) to [remote_offset, +local.size) of the
  // region `remote` describes (write), or that range to `local` (read). kOutOfRange when the
  // range is not inside the described region. `op` comes back in the completion.
  virtual Status write(uint64_t op, const MemRegion& local, const std::string& peer, const IpcDescriptor& remote,
                       size_t remote_offset) = 0;
  virtual Status read(uint64_t op, const MemRegion& local, const std::string& peer, const IpcDescriptor& remote,
                      size_t remote_offset) = 0;
  // Many reads as one operation: lists of pieces, each piece's [remote_offset, +local.size) of
  // its list's region into its `local`, all with one launch of the segment copy kernel
  // (src/cuda/segment_copy.h) on this engine's device, its descriptors read by the kernel from
  // pinned memory; a list's region is mapped once, and each list completes once (its `op`), all
  // at once. For many small chunks or a table chunk's pieces into device memory, where a
  // copy-engine copy each costs more than the bytes (issue 44). kUnavailable, nothing started,
  // when the kernel cannot do it (a local buffer that is not device memory this GPU reaches, gpu
  // push); the caller then reads the pieces one by one. Any other error: no list started.
  struct ListPiece {
    uint64_t remote_offset;
    MemRegion local;
  };
  struct ListRead {
    uint64_t op;
    const IpcDescriptor* remote;
    std::span<const ListPiece> pieces;
  };
  virtual Status read_lists(std::span<const ListRead> lists, const std::string& peer) {
    return Status(Code::kUnavailable, "cuda_ipc: this copy engine has no batched reads");
  }
  // Appends completed copies (in order per stream) to `out`; returns how many.
  virtual size_t progress(std::vector<CopyCompletion>* out) = 0;
  // Polls until a copy completes or the deadline (kTimeout); returns at once when none is pending.
  virtual Status wait(Deadline deadline) = 0;
  virtual size_t pending() const = 0;
  // Ok, or the device's sticky error (the context is unusable: every later copy fails too). Ask
  // after a copy failed to tell a failure of that copy from a broken device.
  virtual Status device_error() = 0;

  // Forwarded to the import cache.
  virtual void invalidate(const std::string& peer, uint64_t alloc_id) = 0;
  virtual void drop_peer(const std::string& peer) = 0;

  // "cuda:0 -> cuda:1 peer access enabled" / "... not possible: <reason>", for statistics.
  virtual std::string peer_access_report() const = 0;
  virtual bool can_access_peer(int other_device) const = 0;
  virtual CopyStats stats() const = 0;
  virtual const ImportCache::Stats& cache_stats() const = 0;
};

}  // namespace dmx::cuda_ipc
