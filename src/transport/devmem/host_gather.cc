// The host gatherer: memcpy into host memory, the simulated device's copy queue into sim memory.
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "memory/backend.h"
#include "transport/devmem/gather.h"

namespace dmx::devmem {
namespace {

Status check_bounds(MemRegion pool, std::span<const Fragment> frags, std::span<const LinearChunk> linear,
                    MemRegion dst) {
  for (const auto& f : frags) {
    if (f.src_offset > pool.size || f.len > pool.size - f.src_offset || f.dst_offset > dst.size ||
        f.len > dst.size - f.dst_offset)
      return Status(Code::kOutOfRange, fmt::format("gather: fragment src {} dst {} len {} outside pool {} / dst {}",
                                                   f.src_offset, f.dst_offset, f.len, pool.size, dst.size));
  }
  for (const auto& c : linear) {
    if (c.dst_offset > dst.size || c.len > dst.size - c.dst_offset)
      return Status(Code::kOutOfRange, fmt::format("gather: linear chunk dst {} len {} outside dst {}", c.dst_offset,
                                                   c.len, dst.size));
  }
  return Status();
}

class HostGatherer final : public Gatherer {
 public:
  Result<uint64_t> enqueue(MemRegion pool, std::span<const Fragment> frags, const uint8_t* linear_host,
                           std::span<const LinearChunk> linear, MemRegion dst) override {
    DMX_RETURN_IF_ERROR(check_bounds(pool, frags, linear, dst));
    if (pool.where.kind != MemKind::kHost && pool.where.kind != MemKind::kPinned)
      return Status(Code::kInvalidArgument, "host gatherer: the pool must be host-readable memory");
    const auto* src = static_cast<const uint8_t*>(pool.ptr);
    auto* out = static_cast<uint8_t*>(dst.ptr);
    if (dst.where.kind == MemKind::kSim) {
      if (!queue_) {
        DMX_ASSIGN_OR_RETURN(MemoryBackend * b, backend_for(dst.where));
        DMX_ASSIGN_OR_RETURN(queue_, b->create_queue());
      }
      for (const auto& f : frags) DMX_RETURN_IF_ERROR(queue_->to_device(out + f.dst_offset, src + f.src_offset, f.len));
      for (const auto& c : linear)
        DMX_RETURN_IF_ERROR(queue_->to_device(out + c.dst_offset, linear_host + c.host_offset, c.len));
      DMX_ASSIGN_OR_RETURN(uint64_t qf, queue_->record());
      ++fence_;
      queue_fence_[fence_ % kRing] = qf;
      return fence_;
    }
    if (dst.where.is_device()) return Status(Code::kInvalidArgument, "host gatherer: CUDA destinations need the CUDA gatherer");
    for (const auto& f : frags) std::memcpy(out + f.dst_offset, src + f.src_offset, f.len);
    for (const auto& c : linear) std::memcpy(out + c.dst_offset, linear_host + c.host_offset, c.len);
    ++fence_;
    queue_fence_[fence_ % kRing] = 0;  // already complete
    return fence_;
  }
  Result<bool> done(uint64_t fence) override {
    uint64_t qf = queue_fence_[fence % kRing];
    if (qf == 0 || !queue_) return true;
    return queue_->done(qf);
  }
  Status wait(uint64_t fence, Deadline deadline) override {
    uint64_t qf = queue_fence_[fence % kRing];
    if (qf == 0 || !queue_) return Status();
    return queue_->wait(qf, deadline);
  }
  Result<void*> allocate_linear(size_t size) override {
    void* p = std::malloc(size ? size : 1);
    if (!p) return Status(Code::kResourceExhausted, fmt::format("malloc({}) for the devmem linear buffer", size));
    return p;
  }
  void free_linear(void* p, size_t) override { std::free(p); }

 private:
  // Fences are asked about only while their tokens are pending; the owner never has more than
  // kRing outstanding (DevmemRx bounds it), and queue fences increase, so a ring suffices.
  static constexpr size_t kRing = 1 << 16;
  std::unique_ptr<CopyQueue> queue_;
  uint64_t fence_ = 0;
  std::vector<uint64_t> queue_fence_ = std::vector<uint64_t>(kRing, 0);
};

}  // namespace

std::unique_ptr<Gatherer> make_host_gatherer() { return std::make_unique<HostGatherer>(); }

}  // namespace dmx::devmem
