#include "memory/bounce_pool.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>

#include "memory/backend.h"

namespace dmx {
namespace {

std::atomic<size_t> g_limit{0};  // bytes; 0: the default

size_t limit_pieces() { return std::max<size_t>(1, BouncePool::pieces_for(bounce_limit())); }

}  // namespace

void raise_bounce_limit(size_t bytes) {
  size_t cur = g_limit.load(std::memory_order_relaxed);
  while (bytes > cur && !g_limit.compare_exchange_weak(cur, bytes, std::memory_order_relaxed)) {
  }
}

size_t bounce_limit() {
  size_t l = g_limit.load(std::memory_order_relaxed);
  return l != 0 ? l : BouncePool::kDefaultLimit;
}

void set_bounce_limit_for_test(size_t bytes) { g_limit.store(bytes, std::memory_order_relaxed); }

Result<BouncePool*> BouncePool::of(MemSpec where) {
  if (!where.is_device())
    return Status(Code::kInvalidArgument, fmt::format("bounce pool: {} is not device memory", to_string(where)));
  // Leaked on purpose: the pieces are never freed (cudaFreeHost would wait for an idle device),
  // and a link may still use one during static destruction.
  static std::mutex mu;
  static auto* cuda = static_cast<BouncePool*>(nullptr);
  static auto* sim = static_cast<BouncePool*>(nullptr);
  std::lock_guard<std::mutex> lock(mu);
  BouncePool*& pool = where.kind == MemKind::kCuda ? cuda : sim;
  if (pool == nullptr) {
    DMX_RETURN_IF_ERROR(backend_for(where).status());
    pool = new BouncePool(where);
  }
  return pool;
}

Result<bool> BouncePool::take(size_t n, std::vector<void*>* out) {
  if (n == 0) return true;
  std::lock_guard<std::mutex> lock(mu_);
  if (in_use_ != 0 && in_use_ + n > limit_pieces()) return false;
  DMX_ASSIGN_OR_RETURN(MemoryBackend * backend, backend_for(where_));
  // Allocated pieces count against the limit like those in use, so the total stays bounded.
  while (free_.size() < n && (allocated_ < limit_pieces() || in_use_ == 0)) {
    auto p = backend->allocate_staging(kPiece);
    if (!p.ok()) {
      if (in_use_ != 0) return false;
      return Status(p.status().code(), fmt::format("bounce pool: {} B of pinned memory for device copies: {}", kPiece,
                                                   p.status().message()));
    }
    free_.push_back(*p);
    ++allocated_;
  }
  if (free_.size() < n) return false;
  out->insert(out->end(), free_.end() - static_cast<std::ptrdiff_t>(n), free_.end());
  free_.resize(free_.size() - n);
  in_use_ += n;
  return true;
}

void BouncePool::give(std::span<void* const> pieces) {
  if (pieces.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  free_.insert(free_.end(), pieces.begin(), pieces.end());
  in_use_ -= std::min(in_use_, pieces.size());
}

size_t BouncePool::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

size_t BouncePool::allocated() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}

}  // namespace dmx
