#include "rpc/pool.h"

#include "rpc/header.h"

#include <string>

namespace dmx::rpc {

Result<std::unique_ptr<Pool>> Pool::create(Context& ctx, const PoolShape& shape) {
  if (shape.mem.kind == MemKind::kSim)
    return Status(Code::kUnavailable, "rpc: the service computes on its pool; sim memory may only be copied");
  DMX_RETURN_IF_ERROR(mem_available(shape.mem));
  if (shape.clients == 0 || shape.slots == 0 || shape.clients > 1024 || shape.slots > 4096)
    return Status(Code::kInvalidArgument, "rpc pool: clients must be 1-1024 and slots 1-4096");
  if (shape.slot_size == 0 || shape.slot_size > (64u << 20))
    return Status(Code::kInvalidArgument, "rpc pool: slot size must be 1 B-64 MiB");
  auto p = std::unique_ptr<Pool>(new Pool());
  p->shape_ = shape;
  p->stride_ = slot_stride(shape.slot_size);
  size_t n = static_cast<size_t>(shape.clients) * shape.slots;  // <= 4M: no overflow below
  size_t slots_bytes = 2 * n * p->stride_;
  size_t ring_bytes = shape.mem.kind == MemKind::kCuda ? 0 : (2 * (n + 1) + 32) * sizeof(uint32_t);
  DMX_ASSIGN_OR_RETURN(p->buf_, Buffer::allocate(shape.mem, slots_bytes + ring_bytes));
  if (ring_bytes > 0) {
    p->doorbells_ = reinterpret_cast<uint32_t*>(static_cast<char*>(p->buf_.data()) + slots_bytes);
    for (size_t i = 0; i < 2 * (n + 1) + 32; ++i) p->doorbells_[i] = 0;
  }
  size_t part_bytes = shape.slots * p->stride_;
  for (uint32_t i = 0; i < shape.clients; ++i) {
    DMX_ASSIGN_OR_RETURN(Registration r, ctx.register_memory(p->buf_.region().sub(i * part_bytes, part_bytes)));
    p->regs_.push_back(std::move(r));
  }
  for (uint32_t i = shape.clients; i-- > 0;) p->free_.push_back(i);
  return p;
}

MemRegion Pool::request(uint32_t global) const {
  return buf_.region().sub(global * stride_, shape_.slot_size);
}

MemRegion Pool::response(uint32_t global) const {
  return buf_.region().sub((static_cast<size_t>(total_slots()) + global) * stride_, shape_.slot_size);
}

std::optional<uint32_t> Pool::acquire_partition() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) return std::nullopt;
  uint32_t p = free_.back();
  free_.pop_back();
  return p;
}

void Pool::release_partition(uint32_t partition) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(partition);
}

}  // namespace dmx::rpc
