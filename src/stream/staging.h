// Pinned staging memory for device<->socket pipelines: slots of one size, allocated once per
// context (through the device's backend, so they are pinned for CUDA) and reused by streams.
#pragma once

#include <mutex>
#include <vector>

#include "memory/backend.h"

namespace dmx::stream {

class StagingPool;

// Decides where staging memory for a device lives, and keeps the books (the context implements it
// with the topology orchestrator). Thread-safe.
class StagingPlacer {
 public:
  virtual ~StagingPlacer() = default;
  // The NUMA node for `bytes` of staging serving `device` (-1: no preference). Recorded as used
  // under `*ticket` (0: nothing recorded) until unplace(ticket).
  virtual int place(MemSpec device, size_t bytes, uint64_t* ticket) = 0;
  virtual void unplace(uint64_t ticket) = 0;
};

// A stream's set of slots; given back to the pool on destruction.
class StagingSlots {
 public:
  StagingSlots() = default;
  ~StagingSlots();
  StagingSlots(StagingSlots&&) noexcept;
  StagingSlots& operator=(StagingSlots&&) noexcept;
  StagingSlots(const StagingSlots&) = delete;
  StagingSlots& operator=(const StagingSlots&) = delete;

  bool empty() const { return slots_.empty(); }
  size_t count() const { return slots_.size(); }
  void* at(int i) const { return slots_[static_cast<size_t>(i)]; }

 private:
  friend class StagingPool;
  void release();
  StagingPool* pool_ = nullptr;
  MemoryBackend* backend_ = nullptr;
  std::vector<void*> slots_;
};

class StagingPool {
 public:
  explicit StagingPool(size_t slot_size, StagingPlacer* placer = nullptr) : slot_size_(slot_size), placer_(placer) {}
  ~StagingPool();
  // `n` slots suitable for copies with `backend`'s device: reused when free, else allocated once,
  // on the NUMA node the placer names for that device.
  Result<StagingSlots> take(MemoryBackend* backend, size_t n);
  size_t slot_size() const { return slot_size_; }
  size_t allocated() const;

 private:
  friend class StagingSlots;
  void give(MemoryBackend* backend, std::vector<void*>& slots);
  struct Free {
    MemoryBackend* backend;
    void* ptr;
    uint64_t ticket = 0;  // the placer's record (all_ only)
  };
  const size_t slot_size_;
  StagingPlacer* const placer_;
  mutable std::mutex mu_;  // guards free_, allocated_
  std::vector<Free> free_;
  size_t allocated_ = 0;
  std::vector<Free> all_;
};

}  // namespace dmx::stream
