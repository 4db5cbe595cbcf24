// Memory registration for the rdma transport: which verbs call registers which memory, the reason
// when none can, and the cache of registrations made for regions the user registered with the
// context (Transport::attach_registration).
//
//   host / pinned memory   ibv_reg_mr
//   CUDA device memory     ibv_reg_dmabuf_mr on the CUDA dma-buf (memory/dmabuf.h), else ibv_reg_mr
//                          on the device pointer where a peer-memory module (nvidia_peermem) is
//                          loaded, else not at all: the path does not carry it and the engine stages
//                          it through another path (the reason is in the path's describe()).
//   p2pmem (a device BAR)  ibv_reg_mr on the mapping of the device's p2pmem allocator (p2pmem.h).
//
// Access: a source (the local side of a WRITE or a SEND) is registered for local access only; a
// region the user registered likewise (its Mr is only ever the local side). The one remote
// access a peer ever gets is a receiver's window: exactly one chunk's destination, registered for
// remote write when the receiver sends its clear-to-send and deregistered when the chunk lands.
//
// Lifetime: an Mr deregisters when destroyed, or earlier by revoke(). A RegionTable entry lives
// exactly as long as the user's registration; its Mrs (one per path's protection domain) are
// deregistered when it goes, and so is every window made inside it that still lives, so no rkey
// outlives its region: a WRITE still on its way is refused by the NIC and never lands in memory
// given back.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dmx/memory.h"
#include "memory/gtlb.h"
#include "dmx/status.h"

namespace dmx::rdma {

// A protection domain, shared by a path and the Mrs made in it (which must go first).
// It keeps `device` (its verbs context) open while it lives.
class Pd {
 public:
  Pd(ibv_pd* pd, std::shared_ptr<const void> device) : pd_(pd), device_(std::move(device)) {}
  ~Pd() { ibv_dealloc_pd(pd_); }
  Pd(const Pd&) = delete;
  Pd& operator=(const Pd&) = delete;
  ibv_pd* get() const { return pd_; }

 private:
  ibv_pd* pd_;
  std::shared_ptr<const void> device_;
};

class Mr {
 public:
  Mr(std::shared_ptr<Pd> pd, ibv_mr* mr, std::string how)
      : pd_(std::move(pd)),
        lkey_(mr->lkey),
        rkey_(mr->rkey),
        addr_(reinterpret_cast<uintptr_t>(mr->addr)),
        length_(mr->length),
        live_(mr),
        how_(std::move(how)) {}
  ~Mr() { revoke(); }
  // Deregisters now (its rkey dies; a WRITE or READ still on its way is refused by the NIC), even
  // while others hold it; the keys read below stay what they were. Idempotent, any thread.
  void revoke() {
    if (ibv_mr* m = live_.exchange(nullptr)) ibv_dereg_mr(m);
  }
  Mr(const Mr&) = delete;
  Mr& operator=(const Mr&) = delete;
  uint32_t lkey() const { return lkey_; }
  uint32_t rkey() const { return rkey_; }
  uintptr_t addr() const { return addr_; }
  uint64_t length() const { return length_; }
  const std::string& how() const { return how_; }  // "ibv_reg_mr", "dma-buf", "peer memory"
  // Whether [addr, addr + len) lies inside (overflow-safe).
  bool holds(uintptr_t a, uint64_t len) const { return a >= addr() && a - addr() <= length() && len <= length() - (a - addr()); }

 private:
  std::shared_ptr<Pd> pd_;
  const uint32_t lkey_, rkey_;
  const uintptr_t addr_;
  const uint64_t length_;
  std::atomic<ibv_mr*> live_;  // null once deregistered
  std::string how_;
};

// How GPU memory is registered here: the rdma_gpu setting against what the machine has.
struct GpuRegistration {
  bool dmabuf = false;   // try ibv_reg_dmabuf_mr (CUDA build; the NIC's driver decides at the call)
  bool peermem = false;  // a peer-memory module is loaded
  std::string why;       // what was found, or why GPU memory goes by other paths
  std::vector<int> staged;  // CUDA ordinals the topology advisor stages through host memory (advice.h)
  // Whether memory of `m` (CUDA) may be registered: a way exists and the advisor does not stage it.
  bool direct(const MemSpec& m) const;
};
GpuRegistration gpu_registration(const std::string& setting);

// Whether a peer-memory module is loaded (nv_mem's version file, or nvidia_peermem); `what` names it.
bool peermem_loaded(std::string* what);

// Registers `r` (non-empty) in `pd` with `access`. kUnavailable with every reason tried when the
// memory cannot be registered (GPU memory without dma-buf or peer memory, sim memory).
Result<std::shared_ptr<Mr>> register_region(const std::shared_ptr<Pd>& pd, const MemRegion& r, int access,
                                            const GpuRegistration& gpu);

class RegionTable;

// One region the user registered with the context, and the Mrs paths made for it.
class RegisteredRegion {
 public:
  RegisteredRegion(MemRegion r, uint64_t id, std::weak_ptr<RegionTable> table)
      : region_(r), id_(id), table_(std::move(table)) {}
  ~RegisteredRegion();
  const MemRegion& region() const { return region_; }
  // The Mr of this region in `pd`, made on first use (the whole region, with `access`).
  Result<std::shared_ptr<Mr>> mr_for(const std::shared_ptr<Pd>& pd, int access, const GpuRegistration& gpu);
  // Drops the Mr made in `pd` (its path is ending).
  void forget(const Pd* pd);
  // `mr` (a window inside this region, made for one chunk) is revoked when the region goes, if it
  // still lives then.
  void track(const std::shared_ptr<Mr>& mr);

 private:
  const MemRegion region_;
  const uint64_t id_;  // the table's key, the GTLB entries' value
  const std::weak_ptr<RegionTable> table_;
  std::mutex mu_;  // guards mrs_, windows_
  std::map<const Pd*, std::shared_ptr<Mr>> mrs_;
  std::vector<std::weak_ptr<Mr>> windows_;
};

// The regions registered with one context. Lookups go through a GTLB (memory/gtlb.h): the region
// of an address is a translation cached by 2 MiB page (64 KiB cells where regions share a page),
// so a chunk anywhere in a registered region costs a lookup, not a scan nor a registration; a
// region's translations are invalidated when it goes. Thread-safe (one mutex, the GTLB's owner).
class RegionTable : public std::enable_shared_from_this<RegionTable> {
 public:
  // The attachment Transport::attach_registration returns: the entry lives while it does. The
  // same region registered again (base, size and kind) returns the live entry, so its Mrs serve.
  std::shared_ptr<RegisteredRegion> add(const MemRegion& r);
  // The registered region that holds [ptr, ptr + len) of kind `where`, or null.
  std::shared_ptr<RegisteredRegion> find(const void* ptr, uint64_t len, const MemSpec& where);
  GtlbCounters translations() const;

 private:
  friend class RegisteredRegion;
  void remove(uint64_t id, const MemRegion& r);

  mutable std::mutex mu_;  // guards everything below
  std::map<uint64_t, std::weak_ptr<RegisteredRegion>> by_id_;
  std::multimap<uintptr_t, uint64_t> by_base_;  // the misses' scan
  Gtlb gtlb_{Gtlb::Limits{.main_entries = 4096, .comp_blocks = 256}};
  uint64_t next_id_ = 1;
};

}  // namespace dmx::rdma
