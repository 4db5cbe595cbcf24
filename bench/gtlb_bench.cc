// gtlb_bench — what a GTLB lookup costs with 1 M translations cached, against what it saves:
// registering memory per operation. Prints one JSON row per measurement. Lookups go to uniformly
// random entries (each one a cache miss: the worst case) and to a working set of 1,024 of them.
//
//   gtlb_bench [--entries N (1048576)] [--lookups N (2000000)]
//
// Lookups are timed one by one with the TSC (x86; steady_clock elsewhere), the timer's own cost
// measured alone and subtracted. "Registering per operation" is pinning a buffer's pages and
// unpinning them (mlock + munlock: the core of ibv_reg_mr and cudaHostRegister) on any machine,
// and with a GPU a fresh cuda_ipc export (an IPC handle) per operation.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "memory/gtlb.h"
#ifdef DMX_HAVE_CUDA
#include "dmx/memory.h"
#include "transport/cuda_ipc/cuda_ipc.h"
#endif

namespace {

using Clock = std::chrono::steady_clock;

#if defined(__x86_64__)
inline uint64_t ticks() {
  unsigned aux;
  return __rdtscp(&aux);
}
double ns_per_tick() {  // calibrated against steady_clock over 200 ms
  const auto t0 = Clock::now();
  const uint64_t c0 = ticks();
  while (Clock::now() - t0 < std::chrono::milliseconds(200)) {
  }
  const uint64_t c1 = ticks();
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / double(c1 - c0);
}
#else
inline uint64_t ticks() { return Clock::now().time_since_epoch().count(); }
double ns_per_tick() { return 1e9 * Clock::period::num / Clock::period::den; }
#endif

struct Pcts {
  double p50, p99, p999;
};
Pcts percentiles(std::vector<double>& v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, size_t(q * double(v.size())))]; };
  return {at(0.50), at(0.99), at(0.999)};
}

void row(const char* what, size_t entries, const Pcts& p, const char* extra = "") {
  std::printf("{\"bench\":\"gtlb\",\"what\":\"%s\",\"entries\":%zu,\"p50_ns\":%.1f,\"p99_ns\":%.1f,"
              "\"p999_ns\":%.1f%s}\n",
              what, entries, p.p50, p.p99, p.p999, extra);
}

template <typename F>
Pcts time_each(size_t n, double tick_ns, double overhead, F&& f) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t t0 = ticks();
    f(i);
    const uint64_t t1 = ticks();
    v[i] = std::max(0.0, double(t1 - t0) * tick_ns - overhead);
  }
  return percentiles(v);
}

}  // namespace

int main(int argc, char** argv) {
  size_t entries = 1 << 20, lookups = 2'000'000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--entries")) entries = std::strtoull(argv[i + 1], nullptr, 0);
    else if (!std::strcmp(argv[i], "--lookups")) lookups = std::strtoull(argv[i + 1], nullptr, 0);
    else {
      std::fprintf(stderr, "usage: gtlb_bench [--entries N] [--lookups N]\n");
      return 2;
    }
  }
  const double tick_ns = ns_per_tick();
  std::vector<double> empty(100000);
  for (auto& x : empty) {
    const uint64_t t0 = ticks();
    const uint64_t t1 = ticks();
    x = double(t1 - t0) * tick_ns;
  }
  const double overhead = percentiles(empty).p50;
  std::printf("{\"bench\":\"gtlb\",\"what\":\"timer\",\"overhead_ns\":%.1f}\n", overhead);

  // `entries` allocations of 2 MiB, each a main entry, scattered over a 2^40-page address space.
  constexpr uint64_t kPage = uint64_t{1} << dmx::Gtlb::kPageShift;
  dmx::Gtlb g(dmx::Gtlb::Limits{entries, 2048});
  std::mt19937_64 rng(std::random_device{}());
  std::vector<uint64_t> pages(entries);
  for (size_t i = 0; i < entries; ++i) pages[i] = (rng() >> 24) | 1;  // 40 bits; duplicates are harmless
  for (size_t i = 0; i < entries; ++i) {
    const dmx::GtlbEntry e{pages[i] * kPage, kPage, i, i};
    g.fill(e, e.base, 8);
  }
  // 2,048 pages of small allocations (complementary cells), 32 of 64 KiB each.
  std::vector<uintptr_t> small;
  for (size_t b = 0; b < 2048; ++b) {
    const uintptr_t page = ((rng() >> 24) | 1) * kPage;
    for (unsigned c = 0; c < dmx::Gtlb::kCells; ++c) {
      const dmx::GtlbEntry e{page + (uintptr_t{c} << dmx::Gtlb::kCellShift), 64 << 10, c, c};
      g.fill(e, e.base, 8);
      small.push_back(e.base);
    }
  }
  const auto filled = g.counters();
  {  // whether the table got huge pages (MADV_HUGEPAGE is advice)
    FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    while (f && std::fgets(line, sizeof line, f))
      if (!std::strncmp(line, "AnonHugePages:", 14))
        std::printf("{\"bench\":\"gtlb\",\"what\":\"huge_pages\",\"anon_huge_kib\":%ld}\n", std::atol(line + 14));
    if (f) std::fclose(f);
  }
  std::vector<uintptr_t> addrs(lookups);
  for (auto& a : addrs) a = pages[rng() % entries] * kPage + rng() % (kPage - 4096);
  uint64_t sink = 0;
  Pcts main_hit = time_each(lookups, tick_ns, overhead, [&](size_t i) {
    auto e = g.lookup(addrs[i], 4096);
    sink += e ? e->value : 1;
  });
  char extra[160];
  std::snprintf(extra, sizeof extra, ",\"main_entries\":%zu,\"comp_blocks\":%zu", filled.main_entries,
                filled.comp_blocks);
  row("lookup_hit_main_uniform", entries, main_hit, extra);
  // The usual case: a working set (the buffers in use now, say 1,024 KV-cache blocks) among them.
  for (auto& a : addrs) a = pages[rng() % 1024] * kPage + rng() % (kPage - 4096);
  row("lookup_hit_main_hot1024", entries, time_each(lookups, tick_ns, overhead, [&](size_t i) {
        auto e = g.lookup(addrs[i], 4096);
        sink += e ? e->value : 1;
      }));
  for (auto& a : addrs) a = small[rng() % small.size()] + rng() % 60000;
  row("lookup_hit_cell", entries, time_each(lookups, tick_ns, overhead, [&](size_t i) {
        auto e = g.lookup(addrs[i], 512);
        sink += e ? e->value : 1;
      }));
  for (auto& a : addrs) a = ((rng() >> 24) | 1) * kPage + 4096;  // almost surely cached nowhere
  row("lookup_miss", entries, time_each(lookups, tick_ns, overhead, [&](size_t i) {
        auto e = g.lookup(addrs[i], 8);
        sink += e ? e->value : 1;
      }));

  // What the cache saves: registering per operation.
  for (size_t size : {size_t{64} << 10, size_t{1} << 20}) {
    void* buf = std::aligned_alloc(4096, size);
    std::memset(buf, 1, size);
    Pcts p = time_each(2000, tick_ns, overhead, [&](size_t) {
      if (mlock(buf, size) == 0) munlock(buf, size);
    });
    std::snprintf(extra, sizeof extra, ",\"size_bytes\":%zu,\"mlock_ok\":%s", size,
                  mlock(buf, size) == 0 && munlock(buf, size) == 0 ? "true" : "false");
    row("register_host_pages", 0, p, extra);
    std::free(buf);
  }
#ifdef DMX_HAVE_CUDA
  if (auto ok = dmx::cuda_ipc::available(); ok.ok()) {
    auto buf = dmx::Buffer::allocate(dmx::MemSpec{dmx::MemKind::kCuda, 0}, 64 << 20);
    if (buf.ok()) {
      const dmx::MemRegion r = buf->region().sub(4096, 64 << 10);
      row("register_cuda_ipc_export", 0, time_each(200, tick_ns, overhead, [&](size_t) {
            dmx::cuda_ipc::Exporter fresh;  // a new handle every time
            sink += fresh.export_region(r).ok();
          }));
      dmx::cuda_ipc::Exporter cached;
      row("cached_cuda_ipc_export", 0, time_each(20000, tick_ns, overhead, [&](size_t) {
            sink += cached.export_region(r).ok();
          }));
    }
  } else {
    std::printf("{\"bench\":\"gtlb\",\"what\":\"register_cuda_ipc_export\",\"skipped\":\"%s\"}\n",
                ok.message().c_str());
  }
#endif
  return sink == 42 ? 1 : 0;  // keeps the lookups from being optimised away
}
