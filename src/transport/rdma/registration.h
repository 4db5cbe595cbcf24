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
// Access: the local side of an RDMA READ gets IBV_ACCESS_LOCAL_WRITE; a chunk the peer reads gets
// IBV_ACCESS_REMOTE_READ and nothing else. No registration ever allows remote writes: a peer can
// place bytes in our memory only by our own READ into a destination our engine chose and checked.
//
// Lifetime: an Mr deregisters when destroyed. A RegionTable entry lives exactly as long as the
// user's registration; its Mrs (one per path's protection domain) are deregistered when it goes,
// so no rkey outlives its region: an operation still in flight on it fails (the NIC refuses the
// key) and never lands in memory given back.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dmx/memory.h"
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
  Mr(std::shared_ptr<Pd> pd, ibv_mr* mr, std::string how) : pd_(std::move(pd)), mr_(mr), how_(std::move(how)) {}
  ~Mr() { ibv_dereg_mr(mr_); }
  Mr(const Mr&) = delete;
  Mr& operator=(const Mr&) = delete;
  uint32_t lkey() const { return mr_->lkey; }
  uint32_t rkey() const { return mr_->rkey; }
  uintptr_t addr() const { return reinterpret_cast<uintptr_t>(mr_->addr); }
  uint64_t length() const { return mr_->length; }
  const std::string& how() const { return how_; }  // "ibv_reg_mr", "dma-buf", "peer memory"
  // Whether [addr, addr + len) lies inside (overflow-safe).
  bool holds(uintptr_t a, uint64_t len) const { return a >= addr() && a - addr() <= length() && len <= length() - (a - addr()); }

 private:
  std::shared_ptr<Pd> pd_;
  ibv_mr* mr_;
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

// One region the user registered with the context, and the Mrs paths made for it.
class RegisteredRegion {
 public:
  explicit RegisteredRegion(MemRegion r) : region_(r) {}
  const MemRegion& region() const { return region_; }
  // The Mr of this region in `pd`, made on first use (the whole region, with `access`).
  Result<std::shared_ptr<Mr>> mr_for(const std::shared_ptr<Pd>& pd, int access, const GpuRegistration& gpu);
  // Drops the Mr made in `pd` (its path is ending).
  void forget(const Pd* pd);

 private:
  const MemRegion region_;
  std::mutex mu_;  // guards mrs_
  std::map<const Pd*, std::shared_ptr<Mr>> mrs_;
};

// The regions registered with one context, by address. Thread-safe.
class RegionTable {
 public:
  // The attachment Transport::attach_registration returns: the entry lives while it does.
  std::shared_ptr<RegisteredRegion> add(const MemRegion& r);
  // The registered region that holds [ptr, ptr + len) of kind `where`, or null.
  std::shared_ptr<RegisteredRegion> find(const void* ptr, uint64_t len, const MemSpec& where);

 private:
  std::mutex mu_;  // guards by_base_
  std::multimap<uintptr_t, std::weak_ptr<RegisteredRegion>> by_base_;
};

}  // namespace dmx::rdma
