#include "stream/staging.h"

#include <linux/mempolicy.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/log.h"

namespace dmx::stream {

StagingSlots::~StagingSlots() { release(); }

StagingSlots::StagingSlots(StagingSlots&& o) noexcept
    : pool_(o.pool_), backend_(o.backend_), slots_(std::move(o.slots_)) {
  o.slots_.clear();
}

StagingSlots& StagingSlots::operator=(StagingSlots&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = o.pool_;
    backend_ = o.backend_;
    slots_ = std::move(o.slots_);
    o.slots_.clear();
  }
  return *this;
}

void StagingSlots::release() {
  if (pool_ != nullptr && !slots_.empty()) pool_->give(backend_, slots_);
  slots_.clear();
}

StagingPool::~StagingPool() {
  for (const Free& f : all_) {
    f.backend->free_staging(f.ptr, slot_size_);
    if (placer_ != nullptr && f.ticket != 0) placer_->unplace(f.ticket);
  }
}

namespace {

// Allocates through `backend` with this thread's memory policy preferring NUMA node `node`: pinned
// pages are allocated and touched by the calling thread, so the policy decides where they live.
Result<void*> allocate_on_node(MemoryBackend* backend, size_t size, int node) {
  bool bound = false;
  if (node >= 0 && node < 64) {
    unsigned long mask = 1UL << node;
    bound = ::syscall(SYS_set_mempolicy, MPOL_PREFERRED, &mask, 64UL) == 0;
    if (!bound) DMX_LOG_DEBUG("staging: set_mempolicy(node {}) failed: errno {}", node, errno);
  }
  auto p = backend->allocate_staging(size);
  if (bound) ::syscall(SYS_set_mempolicy, MPOL_DEFAULT, nullptr, 0UL);
  return p;
}

}  // namespace

Result<StagingSlots> StagingPool::take(MemoryBackend* backend, size_t n) {
  StagingSlots out;
  out.pool_ = this;
  out.backend_ = backend;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.begin(); it != free_.end() && out.slots_.size() < n;) {
    if (it->backend == backend) {
      out.slots_.push_back(it->ptr);
      it = free_.erase(it);
    } else {
      ++it;
    }
  }
  while (out.slots_.size() < n) {
    uint64_t ticket = 0;
    int node = placer_ ? placer_->place(backend->spec(), slot_size_, &ticket) : -1;
    auto p = allocate_on_node(backend, slot_size_, node);
    if (!p.ok()) {
      if (ticket != 0) placer_->unplace(ticket);
      for (void* s : out.slots_) free_.push_back({backend, s});  // under mu_: not via release()
      out.slots_.clear();
      return p.status();
    }
    out.slots_.push_back(*p);
    all_.push_back({backend, *p, ticket});
    ++allocated_;
  }
  return out;
}

void StagingPool::give(MemoryBackend* backend, std::vector<void*>& slots) {
  std::lock_guard<std::mutex> lock(mu_);
  for (void* p : slots) free_.push_back({backend, p});
}

size_t StagingPool::allocated() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}

}  // namespace dmx::stream
