// dmx/memory.h — where bytes live.
//
// MemKind names a kind of memory: plain host memory, pinned (page-locked, registered with the CUDA
// driver) host memory, CUDA device memory of device N, and "sim": a simulated device whose memory
// the engine may touch only through the copy interface (its pages are mapped without access for
// everyone else), so that the device staging pipeline is exercised on machines without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "dmx/status.h"

namespace dmx {

enum class MemKind : uint8_t { kHost = 0, kPinned = 1, kCuda = 2, kSim = 3 };

struct MemSpec {
  MemKind kind = MemKind::kHost;
  int device = 0;  // for kCuda: the CUDA device ordinal; for kSim: an arbitrary simulated id
  bool is_device() const { return kind == MemKind::kCuda || kind == MemKind::kSim; }
  bool operator==(const MemSpec&) const = default;
};

std::string_view mem_kind_name(MemKind kind);
// "host", "pinned", "cuda", "cuda:1", "sim"
Result<MemSpec> parse_mem_spec(std::string_view text);
std::string to_string(const MemSpec& spec);

// A span of memory of one kind. Not owning.
struct MemRegion {
  void* ptr = nullptr;
  size_t size = 0;
  MemSpec where{};  // {}: MemRegion{ptr, size} then draws no -Wmissing-field-initializers

  // Whether [offset, offset + length) lies inside this region (overflow-safe).
  bool contains(size_t offset, size_t length) const { return offset <= size && length <= size - offset; }
  // The sub-range [offset, offset + length). Its range must lie inside (check with contains()
  // where it comes from outside): a range outside is a bug, and terminates the process with a
  // message rather than let a transfer touch memory it does not own.
  MemRegion sub(size_t offset, size_t length) const {
    if (!contains(offset, length)) [[unlikely]]
      sub_out_of_range(offset, length, size);
    return MemRegion{static_cast<char*>(ptr) + offset, length, where};
  }

 private:
  [[noreturn]] static void sub_out_of_range(size_t offset, size_t length, size_t size);
};

// An owned allocation of any kind; freed on destruction. Move-only.
class Buffer {
 public:
  Buffer() = default;
  // Unavailable kinds (no CUDA driver, no such device) fail with Code::kUnavailable and the reason.
  static Result<Buffer> allocate(MemSpec where, size_t size);
  // CUDA device memory on `device` made the way PyTorch's expandable segments are: one address
  // range backed by separate cuMem allocations (cuMemCreate + cuMemMap) of `block` bytes each
  // (rounded up to the driver's granularity), shareable between processes as POSIX fds. For trying
  // dmx with such memory (dmx bench --cuda-alloc cumem); where() is cuda:device.
  static Result<Buffer> allocate_cumem(int device, size_t size, size_t block);
  ~Buffer();
  Buffer(Buffer&&) noexcept;
  Buffer& operator=(Buffer&&) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  MemRegion region() const { return MemRegion{ptr_, size_, where_}; }
  void* data() const { return ptr_; }
  size_t size() const { return size_; }
  MemSpec where() const { return where_; }

 private:
  void reset();
  void* ptr_ = nullptr;
  size_t size_ = 0;
  MemSpec where_;
  bool cumem_ = false;  // from allocate_cumem
};

// Copies src to dst (equal sizes), any kinds, and waits for completion. For tests, tools and
// set-up; the engine itself uses asynchronous copy queues.
Status copy_memory(MemRegion dst, MemRegion src);

// Whether a memory kind can be used in this process, and if not, why ("no CUDA driver: ...").
Status mem_available(MemSpec where);

}  // namespace dmx
