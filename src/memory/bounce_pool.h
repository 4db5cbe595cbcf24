// Pinned bounce buffers: the host side of device copies to and from host memory that is not
// ours to pin (an shm link's slots, mapped per link and shared with a peer).
//
// Why not pin that memory: pinning a mapping per use means unpinning it when the use ends, and
// cudaHostUnregister (like cudaFreeHost) waits until the device is idle while holding a
// process-wide driver lock; with a persistent kernel running (the Lynx GPU workers, any user's) it
// never returns, and every CUDA call of the process waits behind it. So these buffers are
// allocated once (the backend's allocate_staging: portable pinned memory for cuda), in pieces of
// kPiece bytes, and kept until the process exits: nothing here is ever freed or unpinned.
//
// One pool per device kind (cuda, for every device; sim), bounded in total: at most the limit in
// use at once (bounce_limit), allocated as needed up to it. Thread-safe; take() never blocks: a
// taker that gets nothing waits for its own copies to finish and give pieces back, then asks again.
#pragma once

#include <cstddef>
#include <mutex>
#include <span>
#include <vector>

#include "dmx/memory.h"
#include "dmx/status.h"

namespace dmx {

class MemoryBackend;

class BouncePool {
 public:
  static constexpr size_t kPiece = size_t(2) << 20;
  static constexpr size_t kDefaultLimit = size_t(64) << 20;  // the default of shm_bounce_pool

  // The pool for `where`'s device kind (cuda or sim); kInvalidArgument for host kinds, the
  // backend's reason when it is unavailable. Pools live until the process exits.
  static Result<BouncePool*> of(MemSpec where);

  // Appends `n` pieces (kPiece bytes each) to `out`, all or none. False: not now, the pieces in use
  // have reached the limit (or allocating more failed while some are in use): pieces come back as
  // their holders' copies finish. A request larger than the limit is granted while nothing else is
  // in use, so every request is served eventually. An error: nothing is in use and allocating
  // failed (no pinned memory).
  Result<bool> take(size_t n, std::vector<void*>* out);
  // Returns pieces from take(): no copy may still use them.
  void give(std::span<void* const> pieces);

  size_t in_use() const;
  size_t allocated() const;  // pieces; never goes down

  // Pieces needed for `bytes`.
  static size_t pieces_for(size_t bytes) { return bytes / kPiece + (bytes % kPiece != 0); }

 private:
  explicit BouncePool(MemSpec where) : where_(where) {}
  const MemSpec where_;  // the device whose backend allocates
  mutable std::mutex mu_;  // guards the members below
  std::vector<void*> free_;
  size_t in_use_ = 0;
  size_t allocated_ = 0;
};

// The limit of every pool, in bytes (rounded up to whole pieces, at least one): the largest that
// any caller asked for (shm_bounce_pool of each context with shm links), else kDefaultLimit.
void raise_bounce_limit(size_t bytes);
size_t bounce_limit();
// Tests: sets the limit to exactly `bytes` (0: back to the default), lower ones included.
void set_bounce_limit_for_test(size_t bytes);

}  // namespace dmx
