// See trace.h. Record layout (32 bytes, little-endian; record 0 and unwritten records are zero):
// u64 ns, u32 tid, char name[20].
#include "core/trace.h"

#if defined(DMX_TRACE_ENABLED)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace dmx::trace {
namespace {

struct Record {
  uint64_t ns;
  uint32_t tid;
  char name[20];
};
static_assert(sizeof(Record) == 32);

constexpr uint64_t kRecords = 1u << 20;  // 32 MiB per process

struct Sink {
  Record* records = nullptr;
  std::atomic<uint64_t> next{1};

  Sink() {
    const char* base = std::getenv("DMX_TRACE_FILE");
    if (base == nullptr || *base == '\0') return;
    std::string path = std::string(base) + "." + std::to_string(::getpid());
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    if (::ftruncate(fd, static_cast<off_t>(kRecords * sizeof(Record))) == 0) {
      void* p = ::mmap(nullptr, kRecords * sizeof(Record), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) records = static_cast<Record*>(p);
    }
    ::close(fd);
  }
};

Sink& sink() {
  static Sink s;
  return s;
}

}  // namespace

void point(const char* name) {
  Sink& s = sink();
  if (s.records == nullptr) return;
  uint64_t i = s.next.fetch_add(1, std::memory_order_relaxed);
  if (i >= kRecords) return;
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  static thread_local uint32_t tid = static_cast<uint32_t>(::syscall(SYS_gettid));
  Record& r = s.records[i];
  r.ns = static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
  r.tid = tid;
  std::strncpy(r.name, name, sizeof r.name - 1);
  r.name[sizeof r.name - 1] = '\0';
}

}  // namespace dmx::trace
#endif
