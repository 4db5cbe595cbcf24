// Plain host memory: page-aligned allocations the CPU touches directly.
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
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
    // Large buffers are mapped on their own, 2 MiB aligned with transparent huge pages: the
    // kernel's copies into a freshly landing message walk far fewer page-table entries, and a
    // freed buffer goes back to the system at once (from malloc's arenas a long-running server
    // kept hundreds of MiB after its clients left).
    if (size >= 2 * kHuge) return map_huge(size);
    void* p = std::aligned_alloc(kAlign, round_up(size == 0 ? 1 : size));
    if (p == nullptr) return Status(Code::kResourceExhausted, "host allocation failed");
    return p;
  }
  void free(void* ptr, size_t size) override {
    if (size >= 2 * kHuge) ::munmap(ptr, round_up(size, kHuge));
    else std::free(ptr);
  }
  Result<void*> allocate_staging(size_t size) override {
    DMX_ASSIGN_OR_RETURN(void* p, allocate(size));
    ::mlock(p, round_up(size));  // best effort: staging stays resident
    return p;
  }
  void free_staging(void* ptr, size_t size) override {
    ::munlock(ptr, round_up(size));
    free(ptr, size);
  }

 private:
  static Result<void*> map_huge(size_t size) {
    size_t len = round_up(size, kHuge);
    // Map 2 MiB more than needed, keep the aligned part, give back the rest.
    void* raw = ::mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return errno_status("mmap(host buffer)", errno, Code::kResourceExhausted);
    auto base = reinterpret_cast<uintptr_t>(raw);
    uintptr_t aligned = round_up(base, kHuge);
    if (aligned > base) ::munmap(raw, aligned - base);
    if (aligned + len < base + len + kHuge) ::munmap(reinterpret_cast<void*>(aligned + len), base + kHuge - aligned);
    ::madvise(reinterpret_cast<void*>(aligned), len, MADV_HUGEPAGE);  // advice only: fine if refused
    return reinterpret_cast<void*>(aligned);
  }
};

}  // namespace

MemoryBackend* host_backend() {
  static HostBackend backend;
  return &backend;
}

}  // namespace dmx
