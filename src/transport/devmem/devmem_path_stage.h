// The devmem path's copy helpers (devmem_path.h): the RX gatherer with a discard mode, and the
// stager that copies chunk sources into the TX ring. Owned by the path's thread.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "memory/copy_queues.h"
#include "transport/devmem/gather.h"

namespace dmx::devmem {

// The RX gatherer with a discard mode: while `discard` is set, fragments are validated by DevmemRx
// as always but nothing is copied (fence 0 is complete), so a dropped chunk costs no copy.
class SwitchGatherer final : public Gatherer {
 public:
  explicit SwitchGatherer(std::unique_ptr<Gatherer> inner) : inner_(std::move(inner)) {}
  bool discard = false;
  Result<uint64_t> enqueue(MemRegion pool, std::span<const Fragment> frags, const uint8_t* linear_host,
                           std::span<const LinearChunk> linear, MemRegion dst) override;
  Result<bool> done(uint64_t fence) override { return fence == 0 ? Result<bool>(true) : inner_->done(fence); }
  Status wait(uint64_t fence, Deadline d) override { return fence == 0 ? Status() : inner_->wait(fence, d); }
  Result<void*> allocate_linear(size_t size) override { return inner_->allocate_linear(size); }
  void free_linear(void* p, size_t size) override { inner_->free_linear(p, size); }

 private:
  std::unique_ptr<Gatherer> inner_;
};

// Copies chunk sources into the TX ring. Device rings: the gather kernel with 4 KiB descriptors
// (source and ring on one device). Host rings (the double): the source's copy queue (to_host).
class Stager {
 public:
  struct Fence {
    CopyQueue* queue = nullptr;  // null: the gatherer's fence
    uint64_t id = 0;
  };
  // `gatherer` null: a host ring.
  explicit Stager(std::unique_ptr<Gatherer> gatherer) : gatherer_(std::move(gatherer)) {}

  // Copies srcs (a chunk, or a list's pieces of one kind of memory) back to back from slot's
  // start: one gather launch on a device ring, one fence either way.
  Result<Fence> enqueue(std::span<const MemRegion> srcs, MemRegion slot);
  Result<bool> done(Fence f) { return f.queue ? f.queue->done(f.id) : gatherer_->done(f.id); }
  Status wait(Fence f, Deadline d) { return f.queue ? f.queue->wait(f.id, d) : gatherer_->wait(f.id, d); }

 private:
  std::unique_ptr<Gatherer> gatherer_;
  std::vector<Fragment> pieces_;
  CopyQueues queues_;  // by the sources' devices
};

}  // namespace dmx::devmem
