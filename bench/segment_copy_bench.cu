// segment_copy_bench: N scattered blocks of S bytes from one GPU's paged cache to another's, on
// one GPU pair, four ways, so that the engine's choice for vectored cuda_ipc transfers rests on
// numbers (issue 44):
//   contiguous  one cudaMemcpyAsync of N x S bytes (the bound)
//   per-segment one cudaMemcpyAsync per block (what the engine did)
//   batch       one cudaMemcpyBatchAsync of the N blocks (CUDA 12.8+)
//   kernel      one launch of the segment copy kernel (src/cuda/segment_copy.h), descriptors
//               uploaded once through pinned memory (the upload is in the time), run on the
//               destination GPU (reading the source by P2P, as the cuda_ipc receiver does) and on
//               the source GPU (writing by P2P)
// Each way starts from fresh random data and is checked block by block; a mismatch exits 1.
// Usage: segment_copy_bench [--src 0] [--dst 1] [--blocks 16384] [--block-size 65536] [--reps 3]
//                           [--per-launch N] [--piece P] [--launch-streams L]
// --per-launch N adds a way shaped like cuda_ipc's table chunks: launches of N blocks each, their
// descriptors read by the kernel from mapped host memory, as ipc_path's receiver issues them, on
// L streams in turn (default 1). --piece P cuts blocks into descriptors of at most P bytes
// (default kSegmentPiece: one warp copies one descriptor).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "memory/cuda/segment_copy.h"

namespace {

#define CHECK(x)                                                                           \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

using Clock = std::chrono::steady_clock;

struct Args {
  int src = 0, dst = 1;
  uint64_t blocks = 16384, block_size = 65536;
  int reps = 3;
  uint64_t per_launch = 0;
  uint64_t piece = dmx::cuda::kSegmentPiece;
  int launch_streams = 1;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    uint64_t v = std::strtoull(argv[i + 1], nullptr, 0);
    if (k == "--src") a.src = static_cast<int>(v);
    else if (k == "--dst") a.dst = static_cast<int>(v);
    else if (k == "--blocks") a.blocks = v;
    else if (k == "--block-size") a.block_size = v;
    else if (k == "--reps") a.reps = static_cast<int>(v);
    else if (k == "--per-launch") a.per_launch = v;
    else if (k == "--piece") a.piece = v;
    else if (k == "--launch-streams") a.launch_streams = static_cast<int>(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  if (a.blocks == 0 || a.block_size == 0 || a.reps <= 0 || a.piece == 0 || a.launch_streams <= 0) {
    std::fprintf(stderr, "--blocks, --block-size, --reps, --piece and --launch-streams must be > 0\n");
    std::exit(2);
  }
  return a;
}

// Fresh random bytes (xorshift64* from a random seed: GiBs between runs without minutes of it).
void fill(std::vector<unsigned char>& v, std::mt19937_64& rng) {
  uint64_t x = rng() | 1;
  size_t i = 0;
  for (; i + 8 <= v.size(); i += 8) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    uint64_t y = x * 0x2545F4914F6CDD1DULL;
    std::memcpy(v.data() + i, &y, 8);
  }
  for (; i < v.size(); ++i) v[i] = static_cast<unsigned char>(rng());
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("segment_copy_bench: no CUDA device; skipped\n");
    return 0;
  }
  if (a.src >= devices || a.dst >= devices) {
    std::fprintf(stderr, "segment_copy_bench: %d devices, --src %d --dst %d\n", devices, a.src, a.dst);
    return 2;
  }
  const uint64_t capacity = a.blocks + a.blocks / 4;  // scattered ids both sides, as dmx bench --blocks
  const uint64_t bytes = capacity * a.block_size;
  const uint64_t moved = a.blocks * a.block_size;
  std::mt19937_64 rng{std::random_device{}()};
  auto ids = [&] {
    std::vector<uint64_t> v(capacity);
    std::iota(v.begin(), v.end(), 0);
    std::shuffle(v.begin(), v.end(), rng);
    v.resize(a.blocks);
    return v;
  };
  const std::vector<uint64_t> from = ids(), to = ids();

  char *src = nullptr, *dst = nullptr;
  CHECK(cudaSetDevice(a.src));
  CHECK(cudaMalloc(&src, bytes));
  if (a.src != a.dst) {
    cudaError_t e = cudaDeviceEnablePeerAccess(a.dst, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) CHECK(e);
    (void)cudaGetLastError();
  }
  cudaStream_t s_src = nullptr, s_dst = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s_src, cudaStreamNonBlocking));
  CHECK(cudaSetDevice(a.dst));
  CHECK(cudaMalloc(&dst, bytes));
  if (a.src != a.dst) {
    cudaError_t e = cudaDeviceEnablePeerAccess(a.src, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) CHECK(e);
    (void)cudaGetLastError();
  }
  CHECK(cudaStreamCreateWithFlags(&s_dst, cudaStreamNonBlocking));

  // Descriptors: pinned staging, uploaded by each kernel run; device copies on both GPUs.
  std::vector<dmx::cuda::SegmentCopy> host_descs;
  for (uint64_t i = 0; i < a.blocks; ++i) {
    uint64_t at = host_descs.size();
    host_descs.resize(at + (a.block_size + a.piece - 1) / a.piece);
    dmx::cuda::split_segment(reinterpret_cast<uint64_t>(src + from[i] * a.block_size),
                             reinterpret_cast<uint64_t>(dst + to[i] * a.block_size), a.block_size,
                             host_descs.data() + at, a.piece);
  }
  const size_t desc_bytes = host_descs.size() * sizeof(dmx::cuda::SegmentCopy);
  void* pinned = nullptr;
  CHECK(cudaMallocHost(&pinned, desc_bytes));
  std::memcpy(pinned, host_descs.data(), desc_bytes);
  void *desc_on_dst = nullptr, *desc_on_src = nullptr;
  CHECK(cudaSetDevice(a.dst));
  CHECK(cudaMalloc(&desc_on_dst, desc_bytes));
  CHECK(cudaSetDevice(a.src));
  CHECK(cudaMalloc(&desc_on_src, desc_bytes));
  std::vector<void*> dsts(a.blocks), srcs(a.blocks);
  std::vector<size_t> sizes(a.blocks, a.block_size);
  for (uint64_t i = 0; i < a.blocks; ++i) {
    srcs[i] = src + from[i] * a.block_size;
    dsts[i] = dst + to[i] * a.block_size;
  }

  std::vector<unsigned char> src_img(bytes), dst_img(bytes);
  int failures = 0;
  std::printf(
      "# segment_copy_bench: %lu x %lu B (%.1f MiB) cuda:%d -> cuda:%d, %zu descriptors of <= %lu B, %d launch "
      "stream(s), best of %d\n",
      static_cast<unsigned long>(a.blocks), static_cast<unsigned long>(a.block_size),
      static_cast<double>(moved) / (1 << 20), a.src, a.dst, host_descs.size(), static_cast<unsigned long>(a.piece),
      a.launch_streams, a.reps);
  std::printf("# %-20s %10s %10s %10s\n", "way", "ms", "GB/s", "vs_contig");
  double contiguous_s = 0;
  auto run = [&](const char* name, bool blocked, int device, cudaStream_t stream, auto&& issue) {
    double best = 1e30;
    for (int rep = 0; rep < a.reps + 1; ++rep) {  // the first run is an untimed warm-up
      fill(src_img, rng);
      CHECK(cudaMemcpy(src, src_img.data(), bytes, cudaMemcpyHostToDevice));
      CHECK(cudaSetDevice(a.dst));
      CHECK(cudaMemset(dst, 0xA5, bytes));
      CHECK(cudaDeviceSynchronize());
      CHECK(cudaSetDevice(a.src));
      CHECK(cudaDeviceSynchronize());
      CHECK(cudaSetDevice(device));
      auto t0 = Clock::now();
      issue(stream);
      CHECK(cudaStreamSynchronize(stream));
      double t = std::chrono::duration<double>(Clock::now() - t0).count();
      if (rep > 0) best = std::min(best, t);
      CHECK(cudaMemcpy(dst_img.data(), dst, bytes, cudaMemcpyDeviceToHost));
      for (uint64_t i = 0; i < a.blocks; ++i) {
        uint64_t f = blocked ? from[i] : i, g = blocked ? to[i] : i;
        if (std::memcmp(src_img.data() + f * a.block_size, dst_img.data() + g * a.block_size, a.block_size) != 0) {
          std::fprintf(stderr, "%s: block %lu arrived wrong\n", name, static_cast<unsigned long>(i));
          ++failures;
          break;
        }
      }
    }
    if (contiguous_s == 0) contiguous_s = best;
    std::printf("  %-20s %10.3f %10.2f %10.3f\n", name, best * 1e3, static_cast<double>(moved) / best / 1e9,
                contiguous_s / best);
    std::fflush(stdout);
  };

  run("contiguous", false, a.dst, s_dst,
      [&](cudaStream_t s) { CHECK(cudaMemcpyAsync(dst, src, moved, cudaMemcpyDefault, s)); });
  run("per-segment", true, a.dst, s_dst, [&](cudaStream_t s) {
    for (uint64_t i = 0; i < a.blocks; ++i) CHECK(cudaMemcpyAsync(dsts[i], srcs[i], a.block_size, cudaMemcpyDefault, s));
  });
#if CUDART_VERSION >= 12080
  run("batch", true, a.dst, s_dst, [&](cudaStream_t s) {
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t idx = 0;
#if CUDART_VERSION >= 13000
    CHECK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), a.blocks, &attr, &idx, 1, s));
#else
    size_t fail = 0;
    CHECK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), a.blocks, &attr, &idx, 1, &fail, s));
#endif
  });
#else
  std::printf("  batch: needs CUDA 12.8+ (built with %d)\n", CUDART_VERSION);
#endif
  auto kernel = [&](void* descs) {
    return [&, descs](cudaStream_t s) {
      CHECK(cudaMemcpyAsync(descs, pinned, desc_bytes, cudaMemcpyHostToDevice, s));
      dmx::Status st = dmx::cuda::launch_segment_copy(static_cast<const dmx::cuda::SegmentCopy*>(descs),
                                                      host_descs.size(), s);
      if (!st.ok()) {
        std::fprintf(stderr, "%s\n", st.to_string().c_str());
        std::exit(2);
      }
    };
  };
  run("kernel on dst (read)", true, a.dst, s_dst, kernel(desc_on_dst));
  run("kernel on src (write)", true, a.src, s_src, kernel(desc_on_src));
  if (a.per_launch > 0) {
    // The launches go to L streams in turn, each joined to the timed stream by events.
    CHECK(cudaSetDevice(a.dst));
    std::vector<cudaStream_t> lanes(a.launch_streams);
    std::vector<cudaEvent_t> joins(a.launch_streams + 1);
    for (cudaStream_t& l : lanes) CHECK(cudaStreamCreateWithFlags(&l, cudaStreamNonBlocking));
    for (cudaEvent_t& e : joins) CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    const uint64_t per_launch = a.per_launch * ((a.block_size + a.piece - 1) / a.piece);  // descriptors
    char name[64];
    std::snprintf(name, sizeof name, "kernel, %lu a launch", static_cast<unsigned long>(a.per_launch));
    run(name, true, a.dst, s_dst, [&](cudaStream_t s) {
      const auto* all = static_cast<const dmx::cuda::SegmentCopy*>(pinned);  // mapped: UVA
      CHECK(cudaEventRecord(joins[0], s));
      for (cudaStream_t l : lanes) CHECK(cudaStreamWaitEvent(l, joins[0], 0));
      size_t k = 0;
      for (uint64_t at = 0; at < host_descs.size(); at += per_launch, ++k) {
        dmx::Status st = dmx::cuda::launch_segment_copy(all + at, std::min(per_launch, host_descs.size() - at),
                                                        lanes[k % lanes.size()]);
        if (!st.ok()) {
          std::fprintf(stderr, "%s\n", st.to_string().c_str());
          std::exit(2);
        }
      }
      for (size_t i = 0; i < lanes.size(); ++i) {
        CHECK(cudaEventRecord(joins[i + 1], lanes[i]));
        CHECK(cudaStreamWaitEvent(s, joins[i + 1], 0));
      }
    });
  }
  if (failures) {
    std::fprintf(stderr, "segment_copy_bench: %d ways moved wrong bytes\n", failures);
    return 1;
  }
  std::printf("# every run checked block by block: all matched\n");
  return 0;
}
