// The devmem path's copy helpers (devmem_path_stage.h).
#include "transport/devmem/devmem_path_stage.h"

#include <algorithm>

namespace dmx::devmem {
namespace {
constexpr uint32_t kStagePiece = 4096;  // D2D staging descriptors (gather kernel)
}  // namespace

Result<uint64_t> SwitchGatherer::enqueue(MemRegion pool, std::span<const Fragment> frags, const uint8_t* linear_host,
                                         std::span<const LinearChunk> linear, MemRegion dst) {
  if (discard) return uint64_t{0};
  return inner_->enqueue(pool, frags, linear_host, linear, dst);
}

Result<Stager::Fence> Stager::enqueue(MemRegion src, MemRegion slot) {
  if (gatherer_) {
    pieces_.clear();
    for (uint64_t at = 0; at < src.size; at += kStagePiece)
      pieces_.push_back({at, at, static_cast<uint32_t>(std::min<uint64_t>(kStagePiece, src.size - at))});
    DMX_ASSIGN_OR_RETURN(uint64_t f, gatherer_->enqueue(src, pieces_, nullptr, {}, slot));
    return Fence{nullptr, f};
  }
  DMX_ASSIGN_OR_RETURN(CopyQueue * q, queues_.get(src.where));
  DMX_RETURN_IF_ERROR(q->to_host(slot.ptr, src.ptr, src.size));
  DMX_ASSIGN_OR_RETURN(uint64_t f, q->record());
  return Fence{q, f};
}

}  // namespace dmx::devmem
