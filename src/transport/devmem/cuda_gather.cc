// The CUDA gatherer: fragments of a GPU-memory pool gathered by a kernel (src/cuda/gather.cu).
#include <fmt/format.h>

#include <vector>

#include "cuda/gather.h"
#include "transport/devmem/gather.h"

namespace dmx::devmem {
namespace {

class CudaGatherer final : public Gatherer {
 public:
  explicit CudaGatherer(std::unique_ptr<cuda::GatherQueue> q) : q_(std::move(q)) {}

  Result<uint64_t> enqueue(MemRegion pool, std::span<const Fragment> frags, const uint8_t* linear_host,
                           std::span<const LinearChunk> linear, MemRegion dst) override {
    if (pool.where.kind != MemKind::kCuda || dst.where.kind != MemKind::kCuda || pool.where.device != q_->device() ||
        dst.where.device != q_->device())
      return Status(Code::kInvalidArgument, fmt::format("cuda gatherer on cuda:{}: pool {} and destination {} must be its memory",
                                                        q_->device(), to_string(pool.where), to_string(dst.where)));
    descs_.clear();
    descs_.reserve(frags.size());
    for (const auto& f : frags) descs_.push_back({f.src_offset, f.dst_offset, f.len, 0});
    copies_.clear();
    for (const auto& c : linear) copies_.push_back({linear_host + c.host_offset, c.dst_offset, c.len});
    return q_->enqueue(pool.ptr, pool.size, dst.ptr, dst.size, descs_, copies_);
  }
  Result<bool> done(uint64_t fence) override {
    if (fence == 0) return true;
    return q_->done(fence);
  }
  Status wait(uint64_t fence, Deadline deadline) override {
    if (fence == 0) return Status();
    return q_->wait(fence, deadline);
  }
  Result<void*> allocate_linear(size_t size) override { return q_->alloc_pinned(size); }
  void free_linear(void* p, size_t) override { q_->free_pinned(p); }

 private:
  std::unique_ptr<cuda::GatherQueue> q_;
  std::vector<cuda::GatherDesc> descs_;
  std::vector<cuda::HostCopy> copies_;
};

}  // namespace

Result<std::unique_ptr<Gatherer>> make_cuda_gatherer(int device) {
  DMX_ASSIGN_OR_RETURN(auto q, cuda::GatherQueue::create(device));
  return std::unique_ptr<Gatherer>(new CudaGatherer(std::move(q)));
}

}  // namespace dmx::devmem
