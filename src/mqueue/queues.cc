#include "mqueue/queues.h"

#include <cstring>
#include <string>

namespace dmx::mqueue {
namespace {

// a + b, a * b and round-ups that fail instead of wrapping.
bool add(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_add_overflow(a, b, out); }
bool mul(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }
uint64_t align64(uint64_t v) { return (v + 63) & ~uint64_t{63}; }

Status bad(const std::string& what) { return Status(Code::kInvalidArgument, "mqueue geometry: " + what); }

}  // namespace

Result<Layout> compute_layout(const Geometry& g) {
  if (g.workers == 0 || g.workers > kMaxWorkers)
    return bad("workers " + std::to_string(g.workers) + " not in 1.." + std::to_string(kMaxWorkers));
  if (g.slots < 2 || g.slots > kMaxSlots || (g.slots & (g.slots - 1)) != 0)
    return bad("slots " + std::to_string(g.slots) + " not a power of two in 2.." + std::to_string(kMaxSlots));
  if (g.max_request > kMaxPayload || g.max_response > kMaxPayload || g.max_call > kMaxPayload)
    return bad("a payload limit is over " + std::to_string(kMaxPayload) + " B");
  if (g.call_slots > kMaxSlots || (g.call_slots != 0 && g.max_call == 0))
    return bad("call_slots " + std::to_string(g.call_slots) + " needs max_call > 0 and at most " +
               std::to_string(kMaxSlots));
  Layout l{};
  l.g = g;
  l.rx_slot_bytes = static_cast<uint32_t>(align64(sizeof(SlotHeader) + uint64_t{g.max_request}));
  l.tx_slot_bytes = static_cast<uint32_t>(align64(sizeof(SlotHeader) + uint64_t{g.max_response}));
  l.call_slot_bytes = g.call_slots ? static_cast<uint32_t>(align64(sizeof(SlotHeader) + uint64_t{g.max_call})) : 0;
  l.flag_row_bytes = static_cast<uint32_t>(align64(4ull * g.slots));
  l.call_flag_row_bytes = static_cast<uint32_t>(align64(4ull * g.call_slots));

  // Sizes are small enough that only the products can overflow; check every step anyway.
  uint64_t ring = 0, rows = 0, cur = 0, n = 0;
  bool ok = mul(g.workers, sizeof(WorkerCtl), &n);
  l.ctl = 0;
  cur = n;
  l.rx_flags = cur;
  ok = ok && mul(g.workers, l.flag_row_bytes, &rows) && add(cur, rows, &cur);
  l.rx_slots = cur;
  ok = ok && mul(uint64_t{g.workers} * g.slots, l.rx_slot_bytes, &ring) && add(cur, ring, &cur);
  l.crx_flags = cur;
  ok = ok && mul(g.workers, l.call_flag_row_bytes, &rows) && add(cur, rows, &cur);
  l.crx_slots = cur;
  ok = ok && mul(uint64_t{g.workers} * g.call_slots, l.call_slot_bytes, &ring) && add(cur, ring, &cur);
  l.worker_bytes = cur;

  cur = 0;
  l.tx_flags = cur;
  ok = ok && mul(g.workers, l.flag_row_bytes, &rows) && add(cur, rows, &cur);
  l.tx_slots = cur;
  ok = ok && mul(uint64_t{g.workers} * g.slots, l.tx_slot_bytes, &ring) && add(cur, ring, &cur);
  l.ctx_flags = cur;
  ok = ok && mul(g.workers, l.call_flag_row_bytes, &rows) && add(cur, rows, &cur);
  l.ctx_slots = cur;
  ok = ok && mul(uint64_t{g.workers} * g.call_slots, l.call_slot_bytes, &ring) && add(cur, ring, &cur);
  l.stop = cur;
  ok = ok && add(cur, 64, &cur);
  l.response_bytes = cur;
  constexpr uint64_t kMaxRegion = 8ull << 30;
  if (!ok || l.worker_bytes > kMaxRegion || l.response_bytes > kMaxRegion)
    return bad("queues need more than 8 GiB (workers x slots x slot size)");
  return l;
}

Result<std::unique_ptr<QueueSet>> QueueSet::create(const Geometry& g, MemSpec worker_mem) {
  DMX_ASSIGN_OR_RETURN(Layout l, compute_layout(g));
  std::unique_ptr<QueueSet> q(new QueueSet());
  q->layout_ = l;
  q->host_accessible_ = !worker_mem.is_device();
  // Response memory: the worker's stores must land in host DRAM the CPU polls. For GPU workers
  // that is pinned (page-locked, device-mapped) memory; for CPU workers plain memory.
  MemSpec resp_where{worker_mem.kind == MemKind::kCuda ? MemKind::kPinned : MemKind::kHost, 0};
  DMX_ASSIGN_OR_RETURN(q->worker_, Buffer::allocate(worker_mem, l.worker_bytes));
  DMX_ASSIGN_OR_RETURN(q->response_, Buffer::allocate(resp_where, l.response_bytes));
  std::memset(q->response_.data(), 0, l.response_bytes);
  if (q->host_accessible_) {
    std::memset(q->worker_.data(), 0, l.worker_bytes);
  } else {
    // Staging mirrors worker memory byte for byte, so a message is assembled at its own offset.
    DMX_ASSIGN_OR_RETURN(q->staging_, Buffer::allocate(MemSpec{MemKind::kPinned, 0}, l.worker_bytes));
    std::memset(q->staging_.data(), 0, l.worker_bytes);
    DMX_RETURN_IF_ERROR(copy_memory(q->worker_.region(), q->staging_.region()));
  }
  return q;
}

uint8_t* QueueSet::staging_for(uint64_t off) const {
  return (host_accessible_ ? worker_base() : static_cast<uint8_t*>(staging_.data())) + off;
}

Status QueueSet::publish_staged(uint64_t off, size_t n) {
  if (host_accessible_ || n == 0) return Status();
  if (writer_) return writer_->copy(worker_base() + off, staging_for(off), n);
  return copy_memory(worker_.region().sub(off, n), staging_.region().sub(off, n));
}

Status QueueSet::store_worker_word(uint64_t off, uint32_t v) {
  if (host_accessible_) {
    store_release(worker_base(), off, v);
    return Status();
  }
  // Through the word's own place in staging; the copy lands after every earlier one (copy_memory
  // returns once complete; a stream-ordered writer starts it after them). A credit word restaged
  // before its copy ran sends the newer count, which is as good.
  std::memcpy(staging_for(off), &v, 4);
  return publish_staged(off, 4);
}

}  // namespace dmx::mqueue
