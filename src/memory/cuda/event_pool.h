// A per-device pool of CUDA events used as copy-queue fences (internal; CUDA builds only).
//
// Events are created with cudaEventDisableTiming (cheapest to record and query, and they do not
// synchronise with the host) and reused for the life of the process: creating an event takes a
// driver lock and can serialise with work on other threads, so the hot path never does it.
// Thread-safe. The pool is never destroyed (it lives as long as its backend, i.e. the process),
// so events are not destroyed during static destruction after the runtime has unloaded.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <mutex>
#include <vector>

#include "dmx/status.h"

namespace dmx::cuda {

class EventPool {
 public:
  explicit EventPool(int device) : device_(device) {}
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // Creates `n` events up front (best effort: a failure is returned, events made so far stay).
  Status reserve(size_t n);
  // A free event of this pool's device; creates one only when the pool is empty.
  Result<cudaEvent_t> acquire();
  // Returns an event. Re-recording an event whose previous record has not completed is allowed
  // by CUDA; the next owner's cudaEventRecord simply replaces the captured work.
  void release(cudaEvent_t event);

  size_t created() const;  // events created over the pool's life (for tests and stats)
  size_t idle() const;     // events in the pool now

 private:
  Result<cudaEvent_t> create_locked();  // mu_ held
  const int device_;
  mutable std::mutex mu_;  // guards free_, created_
  std::vector<cudaEvent_t> free_;
  size_t created_ = 0;
};

}  // namespace dmx::cuda
