// rpc/pool.h — the server's registered receive pool, in the memory the work runs on.
//
// Layout: `clients` partitions of `slots` slots; a slot is a request area and a response area
// of slot_size bytes each (256-byte aligned, so kernels may load floats), in one Buffer of the
// server's memory kind. Each partition's request areas are contiguous and registered on their
// own, so a client's one-sided writes (dmx bounds them by the registration) reach its own slots
// only; the response areas are not registered: responses leave from them by send. After
// the slots, host memory pools carry the doorbell ring that gpu mode's worker polls.
// Partitions are handed to connections; acquire/release are thread-safe, the rest is immutable.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "dmx/context.h"
#include "dmx/memory.h"

namespace dmx::rpc {

struct PoolShape {
  MemSpec mem;
  uint32_t clients = 8;
  uint32_t slots = 16;  // per client
  uint32_t slot_size = 64 << 10;
};

class Pool {
 public:
  // kInvalidArgument for a shape that overflows or is empty; kUnavailable for a memory kind the
  // service cannot compute on (sim) or that this machine lacks.
  static Result<std::unique_ptr<Pool>> create(Context& ctx, const PoolShape& shape);

  const PoolShape& shape() const { return shape_; }
  uint32_t total_slots() const { return shape_.clients * shape_.slots; }
  uint32_t global(uint32_t partition, uint32_t local) const { return partition * shape_.slots + local; }
  MemRegion request(uint32_t global) const;
  MemRegion response(uint32_t global) const;
  // Host memory only: 2 * (total_slots() + 1) + 32 words for gpu mode's doorbell and completion rings.
  uint32_t* doorbell_words() const { return doorbells_; }
  // What a client of `partition` writes its payloads into, at slot * slot_stride().
  RemoteRegion partition_region(uint32_t partition) const { return regs_[partition].remote(); }

  std::optional<uint32_t> acquire_partition();
  void release_partition(uint32_t partition);

 private:
  PoolShape shape_;
  size_t stride_ = 0;  // slot_size rounded up to 256
  Buffer buf_;
  std::vector<Registration> regs_;  // one per partition
  uint32_t* doorbells_ = nullptr;
  std::mutex mu_;  // guards free_
  std::vector<uint32_t> free_;
};

}  // namespace dmx::rpc
