#include "transport/tcp/staging.h"

namespace dmx::tcp {

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
  for (const Free& f : all_) f.backend->free_staging(f.ptr, slot_size_);
}

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
    auto p = backend->allocate_staging(slot_size_);
    if (!p.ok()) {
      for (void* s : out.slots_) free_.push_back({backend, s});  // under mu_: not via release()
      out.slots_.clear();
      return p.status();
    }
    out.slots_.push_back(*p);
    all_.push_back({backend, *p});
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

}  // namespace dmx::tcp
