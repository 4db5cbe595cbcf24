// Plain host memory: page-aligned allocations the CPU touches directly.
#include <sys/mman.h>

#include <cstdlib>
#include <new>

#include "core/sys.h"
#include "memory/backend.h"

namespace dmx {
namespace {

constexpr size_t kAlign = 4096;
constexpr size_t kHuge = 2 << 20;

size_t round_up(size_t n, size_t a = kAlign) { return (n + a - 1) / a * a; }

class HostBackend final : public MemoryBackend {
 public:
  MemSpec spec() const override { return MemSpec{MemKind::kHost, 0}; }
  bool host_accessible() const override { return true; }
  Result<void*> allocate(size_t size) override {
    // Large buffers get 2 MiB alignment and transparent huge pages: the kernel's copies into a
    // freshly landing message then walk far fewer page-table entries.
    bool huge = size >= 2 * kHuge;
    size_t align = huge ? kHuge : kAlign;
    void* p = std::aligned_alloc(align, round_up(size == 0 ? 1 : size, align));
    if (p == nullptr) return Status(Code::kResourceExhausted, "host allocation failed");
    if (huge) ::madvise(p, round_up(size, align), MADV_HUGEPAGE);  // advice only: fine if refused
    return p;
  }
  void free(void* ptr, size_t) override { std::free(ptr); }
  Result<void*> allocate_staging(size_t size) override {
    DMX_ASSIGN_OR_RETURN(void* p, allocate(size));
    ::mlock(p, round_up(size));  // best effort: staging stays resident
    return p;
  }
  void free_staging(void* ptr, size_t size) override {
    ::munlock(ptr, round_up(size));
    std::free(ptr);
  }
};

}  // namespace

MemoryBackend* host_backend() {
  static HostBackend backend;
  return &backend;
}

}  // namespace dmx
