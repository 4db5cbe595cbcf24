// devmem gather benchmark: the GPU gather of devmem TCP fragments (dmx::cuda::launch_gather)
// against a plain device-to-device copy of the same bytes, measured in the same run.
//
//   dmx_bench_devmem_gather [--size-mib 256] [--iters 20] [--device 0] [--json FILE]
//
// Fragments: 4 KiB pages of a pool, in random order (as a NIC's page pool hands them out),
// gathered into a contiguous destination; plus an MTU-1500-like case (1448-byte fragments at
// random page offsets) for information. Target: 4 KiB gather >= 80% of the D2D copy bandwidth.
// Exit status: 0 when the target is met and the gathered bytes are right, 1 otherwise, 2 when
// no GPU can be used.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/gather.h"

namespace {

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s failed: %s (%s)\n", #x, cudaGetErrorName(e_), cudaGetErrorString(e_)); \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

struct Timing {
  double ms_per_iter;
  double gbps;
};

template <typename F>
Timing time_it(F&& f, int iters, size_t bytes, cudaStream_t s) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  f();  // warm-up
  CK(cudaStreamSynchronize(s));
  CK(cudaEventRecord(a, s));
  for (int i = 0; i < iters; ++i) f();
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  double per = ms / iters;
  return {per, bytes / (per * 1e-3) / 1e9};
}

}  // namespace

int main(int argc, char** argv) {
  size_t size_mib = 256;
  int iters = 20, device = 0;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--size-mib" && i + 1 < argc) size_mib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (a == "--device" && i + 1 < argc) device = std::atoi(argv[++i]);
    else if (a == "--json" && i + 1 < argc) json = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--size-mib N] [--iters N] [--device N] [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n <= device) {
    std::fprintf(stderr, "no usable CUDA device %d\n", device);
    return 2;
  }
  CK(cudaSetDevice(device));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, device));
  const size_t size = size_mib << 20, page = 4096, pages = size / page;
  uint8_t *pool = nullptr, *dst = nullptr;
  unsigned* errors = nullptr;
  CK(cudaMalloc(&pool, size));
  CK(cudaMalloc(&dst, size));
  CK(cudaMalloc(&errors, sizeof(unsigned)));
  CK(cudaMemset(errors, 0, sizeof(unsigned)));
  std::vector<uint8_t> host(size);
  std::mt19937_64 rng(42);
  for (size_t i = 0; i < size; i += 8) {
    uint64_t v = rng();
    std::memcpy(host.data() + i, &v, 8);
  }
  CK(cudaMemcpy(pool, host.data(), size, cudaMemcpyHostToDevice));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // 4 KiB fragments, random page order.
  std::vector<uint64_t> perm(pages);
  for (size_t i = 0; i < pages; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<dmx::cuda::GatherDesc> d4k(pages);
  for (size_t i = 0; i < pages; ++i) d4k[i] = {perm[i] * page, i * page, static_cast<uint32_t>(page), 0};
  // 1448-byte fragments at random offsets inside random pages.
  std::vector<dmx::cuda::GatherDesc> dmss;
  for (uint64_t at = 0; at + 1448 <= size; at += 1448)
    dmss.push_back({(rng() % pages) * page + rng() % (page - 1448 + 1), at, 1448, 0});

  dmx::cuda::GatherDesc *dd4k = nullptr, *ddmss = nullptr;
  CK(cudaMalloc(&dd4k, d4k.size() * sizeof d4k[0]));
  CK(cudaMalloc(&ddmss, dmss.size() * sizeof dmss[0]));
  CK(cudaMemcpy(dd4k, d4k.data(), d4k.size() * sizeof d4k[0], cudaMemcpyHostToDevice));
  CK(cudaMemcpy(ddmss, dmss.data(), dmss.size() * sizeof dmss[0], cudaMemcpyHostToDevice));

  auto gather = [&](const dmx::cuda::GatherDesc* dd, size_t count) {
    dmx::Status st = dmx::cuda::launch_gather(dd, static_cast<uint32_t>(count), pool, size, dst, size, errors, s);
    if (!st.ok()) {
      std::fprintf(stderr, "launch_gather: %s\n", st.message().c_str());
      std::exit(2);
    }
  };
  Timing copy = time_it([&] { CK(cudaMemcpyAsync(dst, pool, size, cudaMemcpyDeviceToDevice, s)); }, iters, size, s);
  Timing g4k = time_it([&] { gather(dd4k, d4k.size()); }, iters, size, s);
  // Check the 4 KiB gather's bytes.
  std::vector<uint8_t> got(size);
  CK(cudaMemcpy(got.data(), dst, size, cudaMemcpyDeviceToHost));
  bool correct = true;
  for (size_t i = 0; i < pages && correct; ++i)
    correct = std::memcmp(got.data() + i * page, host.data() + perm[i] * page, page) == 0;
  size_t mss_bytes = dmss.size() * 1448;
  Timing gmss = time_it([&] { gather(ddmss, dmss.size()); }, iters, mss_bytes, s);
  Timing copy2 = time_it([&] { CK(cudaMemcpyAsync(dst, pool, size, cudaMemcpyDeviceToDevice, s)); }, iters, size, s);
  unsigned bad = 0;
  CK(cudaMemcpy(&bad, errors, sizeof bad, cudaMemcpyDeviceToHost));
  const double ref = std::max(copy.gbps, copy2.gbps);  // the better of the two reference runs
  const double ratio = g4k.gbps / ref;
  const bool pass = correct && bad == 0 && ratio >= 0.8;
  std::printf("device %d: %s (%d SMs)\n", device, prop.name, prop.multiProcessorCount);
  std::printf("d2d copy      %4zu MiB: %8.3f ms  %8.1f GB/s (second run %.1f GB/s)\n", size_mib, copy.ms_per_iter,
              copy.gbps, copy2.gbps);
  std::printf("gather 4 KiB  %zu frags: %8.3f ms  %8.1f GB/s  = %.1f%% of d2d (target >= 80%%)\n", d4k.size(),
              g4k.ms_per_iter, g4k.gbps, 100 * ratio);
  std::printf("gather 1448 B %zu frags: %8.3f ms  %8.1f GB/s  = %.1f%% of d2d (information)\n", dmss.size(),
              gmss.ms_per_iter, gmss.gbps, 100 * gmss.gbps / ref);
  std::printf("bytes correct: %s; out-of-bounds descriptors: %u; result: %s\n", correct ? "yes" : "NO", bad,
              pass ? "PASS" : "FAIL");
  if (!json.empty()) {
    if (FILE* f = std::fopen(json.c_str(), "w")) {
      std::fprintf(f,
                   "{\"bench\":\"devmem_gather\",\"device\":\"%s\",\"size_bytes\":%zu,\"iters\":%d,"
                   "\"d2d_copy_gbps\":%.2f,\"d2d_copy_gbps_runs\":[%.2f,%.2f],\"gather_4k_gbps\":%.2f,"
                   "\"gather_4k_frags\":%zu,\"gather_4k_ratio\":%.4f,\"gather_1448_gbps\":%.2f,"
                   "\"gather_1448_frags\":%zu,\"correct\":%s,\"target_ratio\":0.8,\"pass\":%s}\n",
                   prop.name, size, iters, ref, copy.gbps, copy2.gbps, g4k.gbps, d4k.size(), ratio, gmss.gbps,
                   dmss.size(), correct ? "true" : "false", pass ? "true" : "false");
      std::fclose(f);
    }
  }
  cudaFree(pool);
  cudaFree(dst);
  cudaFree(errors);
  cudaFree(dd4k);
  cudaFree(ddmss);
  return pass ? 0 : 1;
}
