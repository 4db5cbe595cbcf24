// What the copy engines give staged TCP's copies with nothing else running: N threads, each with
// its own stream and ring of pinned slots (as the staged path's streams), copy CHUNK-sized pieces
// GPU0 -> pinned (D2H), pinned -> GPU1 (H2D), or both at once (the two ends of a staged GPU0 ->
// GPU1 transfer). One JSON line per mode with the aggregate GB/s and the p50 / p90 of one copy's
// issue-to-done time, to set beside the stage table of docs/performance.md (issue 46, item 3).
//
//   stage_copy_probe [--threads 8] [--chunk 1M] [--slots 4] [--total 256M] [--rounds 3] [--mode all]
//                    [--rate GBPS]
//
// --mode d2h|h2d|both runs only that mode (as load beside another benchmark); all: the three.
// --rate caps each direction at GBPS (10^9 B/s) in all, shared by the threads: the DMA load of a
// staged transfer at that rate, not the engines' most. A copy's time then includes the pacing
// (its slot is waited for only when reused), so the p50 / p90 are left out.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/units.h"

namespace {

using Clock = std::chrono::steady_clock;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

struct Lane {
  int device = 0;
  cudaMemcpyKind kind = cudaMemcpyDeviceToHost;
  void* dev = nullptr;    // `total` bytes on `device`
  char* pinned = nullptr; // slots * chunk
  cudaStream_t stream{};
  std::vector<cudaEvent_t> done;
  std::vector<double> lat_us;
};

// One lane copies `total` bytes in chunks through its ring: at most `slots` copies in flight, the
// oldest waited for before its slot is reused (the staged path's sender and receiver rings).
// With `gap` > 0, copy i is issued no earlier than i * gap after the start.
void run_lane(Lane& l, size_t chunk, int slots, size_t total, Clock::duration gap) {
  check(cudaSetDevice(l.device), "cudaSetDevice");
  std::vector<Clock::time_point> issued(slots);
  size_t n = total / chunk;
  const auto start = Clock::now();
  for (size_t i = 0; i < n; ++i) {
    if (gap.count() > 0) std::this_thread::sleep_until(start + gap * static_cast<int64_t>(i));
    int s = static_cast<int>(i % slots);
    if (i >= static_cast<size_t>(slots)) {
      check(cudaEventSynchronize(l.done[s]), "cudaEventSynchronize");
      l.lat_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - issued[s]).count());
    }
    char* host = l.pinned + s * chunk;
    char* dev = static_cast<char*>(l.dev) + i * chunk;
    issued[s] = Clock::now();
    if (l.kind == cudaMemcpyDeviceToHost) check(cudaMemcpyAsync(host, dev, chunk, l.kind, l.stream), "D2H");
    else check(cudaMemcpyAsync(dev, host, chunk, l.kind, l.stream), "H2D");
    check(cudaEventRecord(l.done[s], l.stream), "cudaEventRecord");
  }
  for (size_t i = n > static_cast<size_t>(slots) ? n - slots : 0; i < n; ++i) {
    int s = static_cast<int>(i % slots);
    check(cudaEventSynchronize(l.done[s]), "cudaEventSynchronize");
    l.lat_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - issued[s]).count());
  }
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 8, slots = 4, rounds = 3;
  double rate = 0;  // GB/s per direction; 0: as fast as the engines go
  std::string only = "all";
  size_t chunk = 1 << 20, total = 256 << 20;
  auto count = [](const char* v, int lo, int hi, int* out) {
    auto n = dmx::parse_int(v);
    if (!n.ok() || *n < lo || *n > hi) return false;
    *out = static_cast<int>(*n);
    return true;
  };
  for (int i = 1; i < argc; i += 2) {
    std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    bool ok = true;
    if (a == "--chunk" || a == "--total") {
      auto n = dmx::parse_size(v);
      ok = n.ok() && *n > 0;
      if (ok) (a == "--chunk" ? chunk : total) = *n;
    } else if (a == "--threads") {
      ok = count(v, 1, 64, &threads);
    } else if (a == "--slots") {
      ok = count(v, 1, 64, &slots);
    } else if (a == "--rounds") {
      ok = count(v, 1, 100000, &rounds);
    } else if (a == "--rate") {
      char* end = nullptr;
      rate = std::strtod(v, &end);
      ok = end != v && *end == '\0' && rate > 0 && rate < 1e4;
    } else if (a == "--mode") {
      only = v;
      ok = only == "all" || only == "d2h" || only == "h2d" || only == "both";
    } else {
      ok = false;
    }
    if (!ok) return std::fprintf(stderr, "stage_copy_probe: %s %s: not understood\n", a.c_str(), v), 2;
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) {
    std::printf("{\"skipped\": \"no CUDA device\"}\n");
    return 0;
  }
  int dst_gpu = gpus > 1 ? 1 : 0;
  size_t per_lane = total / threads / chunk * chunk;
  auto make = [&](int device, cudaMemcpyKind kind) {
    Lane l;
    l.device = device;
    l.kind = kind;
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaMalloc(&l.dev, per_lane), "cudaMalloc");
    check(cudaMemset(l.dev, 0x5a, per_lane), "cudaMemset");
    check(cudaMallocHost(reinterpret_cast<void**>(&l.pinned), slots * chunk), "cudaMallocHost");
    std::memset(l.pinned, 0xa5, slots * chunk);
    check(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    l.done.resize(slots);
    for (auto& e : l.done) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    return l;
  };
  std::vector<Lane> d2h, h2d;
  for (int t = 0; t < threads; ++t) {
    d2h.push_back(make(0, cudaMemcpyDeviceToHost));
    h2d.push_back(make(dst_gpu, cudaMemcpyHostToDevice));
  }
  for (int r = 0; r < rounds; ++r) {
    for (const char* mode : {"d2h", "h2d", "both"}) {
      if (only != "all" && only != mode) continue;
      std::vector<Lane*> lanes;
      if (std::strcmp(mode, "h2d") != 0)
        for (auto& l : d2h) lanes.push_back(&l);
      if (std::strcmp(mode, "d2h") != 0)
        for (auto& l : h2d) lanes.push_back(&l);
      for (auto* l : lanes) l->lat_us.clear();
      auto t0 = Clock::now();
      std::vector<std::thread> ts;
      // Each lane's share of the rate: one chunk every threads * chunk / rate seconds.
      Clock::duration gap{};
      if (rate > 0)
        gap = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(threads * chunk / (rate * 1e9)));
      for (auto* l : lanes) ts.emplace_back(run_lane, std::ref(*l), chunk, slots, per_lane, gap);
      for (auto& t : ts) t.join();
      double s = std::chrono::duration<double>(Clock::now() - t0).count();
      std::vector<double> lat;
      for (auto* l : lanes) lat.insert(lat.end(), l->lat_us.begin(), l->lat_us.end());
      // For "both", GB/s counts each byte once (one direction's bytes), as a transfer's rate does.
      double bytes = static_cast<double>(per_lane) * threads;
      std::string copy_times;
      if (rate == 0) {
        char b[96];
        std::snprintf(b, sizeof b, ", \"copy_p50_us\": %.1f, \"copy_p90_us\": %.1f", pct(lat, 0.5), pct(lat, 0.9));
        copy_times = b;
      }
      std::printf(
          "{\"round\": %d, \"mode\": \"%s\", \"threads\": %d, \"chunk\": %zu, \"slots\": %d, \"rate_cap\": %.2f, "
          "\"gb_per_s\": %.2f%s, \"src_gpu\": 0, \"dst_gpu\": %d}\n",
          r, mode, threads, chunk, slots, rate, bytes / s / 1e9, copy_times.c_str(), dst_gpu);
      std::fflush(stdout);
    }
  }
  return 0;
}
