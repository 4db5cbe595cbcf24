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
#include <cstdio>
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

// Takes `n` adjacent records, or none when the file is full.
Record* take(uint64_t n) {
  Sink& s = sink();
  if (s.records == nullptr) return nullptr;
  uint64_t i = s.next.fetch_add(n, std::memory_order_relaxed);
  if (i + n > kRecords) return nullptr;
  return &s.records[i];
}

uint32_t thread_id() {
  static thread_local uint32_t tid = static_cast<uint32_t>(::syscall(SYS_gettid));
  return tid;
}

uint64_t now_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

void fill(Record& r, uint64_t ns, const char* name, char mark, const void* id) {
  r.ns = ns;
  r.tid = thread_id();
  if (id == nullptr) {
    std::strncpy(r.name, name, sizeof r.name - 1);
  } else {
    auto h = static_cast<unsigned>((reinterpret_cast<uintptr_t>(id) >> 4) & 0xffffff);
    std::snprintf(r.name, sizeof r.name, "%.11s%c%06x", name, mark, h);
  }
  r.name[sizeof r.name - 1] = '\0';
}

}  // namespace

void point(const char* name) {
  if (Record* r = take(1)) fill(*r, now_ns(), name, 0, nullptr);
}

void at(const char* name, const void* id) {
  if (Record* r = take(1)) fill(*r, now_ns(), name, '@', id);
}

void span(const char* name, const void* id, std::chrono::steady_clock::time_point t0) {
  // libstdc++'s steady_clock is CLOCK_MONOTONIC, the clock of the other records.
  auto start = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count());
  if (Record* r = take(2)) {
    fill(r[0], start, name, '+', id);
    fill(r[1], now_ns(), name, '-', id);
  }
}

}  // namespace dmx::trace
#endif
