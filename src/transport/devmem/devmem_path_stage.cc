// The devmem path's copy helpers (devmem_path_stage.h).
#include "transport/devmem/devmem_path_stage.h"

#include <algorithm>
#include <cstdint>

namespace dmx::devmem {
namespace {
constexpr uint32_t kStagePiece = 4096;  // D2D staging descriptors (gather kernel)
}  // namespace

Result<uint64_t> SwitchGatherer::enqueue(MemRegion pool, std::span<const Fragment> frags, const uint8_t* linear_host,
                                         std::span<const LinearChunk> linear, MemRegion dst) {
  if (discard) return uint64_t{0};
  return inner_->enqueue(pool, frags, linear_host, linear, dst);
}

Result<Stager::Fence> Stager::enqueue(std::span<const MemRegion> srcs, MemRegion slot) {
  if (gatherer_) {  // the pieces as fragments of the span of device memory that holds them all
    auto at = [](const MemRegion& r) { return reinterpret_cast<uintptr_t>(r.ptr); };
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (const MemRegion& r : srcs) {
      lo = std::min(lo, at(r));
      hi = std::max(hi, at(r) + r.size);
    }
    pieces_.clear();
    uint64_t to = 0;
    for (const MemRegion& r : srcs) {
      for (uint64_t k = 0; k < r.size; k += kStagePiece)
        pieces_.push_back({at(r) - lo + k, to + k, static_cast<uint32_t>(std::min<uint64_t>(kStagePiece, r.size - k))});
      to += r.size;
    }
    DMX_ASSIGN_OR_RETURN(uint64_t f, gatherer_->enqueue(MemRegion{reinterpret_cast<void*>(lo), hi - lo, srcs[0].where},
                                                        pieces_, nullptr, {}, slot));
    return Fence{nullptr, f};
  }
  DMX_ASSIGN_OR_RETURN(CopyQueue * q, queues_.get(srcs[0].where));
  uint64_t to = 0;
  for (const MemRegion& r : srcs) {
    DMX_RETURN_IF_ERROR(q->to_host(static_cast<unsigned char*>(slot.ptr) + to, r.ptr, r.size));
    to += r.size;
  }
  DMX_ASSIGN_OR_RETURN(uint64_t f, q->record());
  return Fence{q, f};
}

}  // namespace dmx::devmem
