// mqueue/queues.h — the memory of a set of Lynx message queues and the host-side accessors.
//
// QueueSet allocates worker memory (where the workers run: host or cuda:N) and response memory
// (host; pinned when the workers are on a GPU so that its stores reach host DRAM) through dmx
// Buffers, and pinned staging for the dispatcher when worker memory is not host-accessible.
// Writes into worker memory go through dmx::copy_memory when that memory is a device's, as
// plain stores otherwise. Flags are u32 written with release order and read with acquire order
// (docs/mqueue.md, "memory ordering").
//
// Thread-safety: the accessors are safe from any thread for distinct offsets; staging and the
// writer belong to the dispatcher thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "dmx/memory.h"
#include "mqueue/layout.h"

namespace dmx::mqueue {

// Offsets for `g`, or kInvalidArgument naming the field out of range (checked 64-bit sums).
Result<Layout> compute_layout(const Geometry& g);

inline uint32_t load_acquire(const uint8_t* base, uint64_t off) {
  return std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(const_cast<uint8_t*>(base) + off))
      .load(std::memory_order_acquire);
}
inline void store_release(uint8_t* base, uint64_t off, uint32_t v) {
  std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(base + off)).store(v, std::memory_order_release);
}

// Moves bytes from pinned staging into device worker memory, in call order. The default is
// dmx::copy_memory (each copy waits for completion); GPU servers may install a stream-ordered
// writer (gpu_workers.h) so that the dispatcher never waits for the GPU. Staging bytes stay
// unchanged until the copy ran (a slot is restaged only after its response came back).
class WorkerWriter {
 public:
  virtual ~WorkerWriter() = default;
  virtual Status copy(void* dst_device, const void* src_pinned, size_t n) = 0;
};

class QueueSet {
 public:
  static Result<std::unique_ptr<QueueSet>> create(const Geometry& g, MemSpec worker_mem);

  const Layout& layout() const { return layout_; }
  MemSpec worker_where() const { return worker_.where(); }
  bool worker_host_accessible() const { return host_accessible_; }
  uint8_t* worker_base() const { return static_cast<uint8_t*>(worker_.data()); }  // device pointer for cuda
  uint8_t* response_base() const { return static_cast<uint8_t*>(response_.data()); }

  // Where the dispatcher assembles a message for worker memory at `off` (header + payload): the
  // slot itself when worker memory is host memory, else a pinned staging copy of it.
  uint8_t* staging_for(uint64_t off) const;
  // Moves [off, off + n) from staging into worker memory (no-op for host memory: it is there).
  Status publish_staged(uint64_t off, size_t n);
  // Stores a flag or credit word into worker memory, after everything published before it.
  Status store_worker_word(uint64_t off, uint32_t v);

  // Installs a writer for device worker memory (before the dispatcher starts).
  void set_writer(std::unique_ptr<WorkerWriter> writer) { writer_ = std::move(writer); }

  uint32_t load_response_word(uint64_t off) const { return load_acquire(response_base(), off); }
  void store_response_word(uint64_t off, uint32_t v) { store_release(response_base(), off, v); }

 private:
  QueueSet() = default;
  Layout layout_{};
  Buffer worker_, response_, staging_;
  std::unique_ptr<WorkerWriter> writer_;
  bool host_accessible_ = false;
};

}  // namespace dmx::mqueue
