// The segment copy kernel (src/cuda/segment_copy.h) on a GPU: byte-exact for odd sizes and
// offsets in every relative alignment, empty segments, segments cut into pieces, 100,000
// segments, and GPU to GPU by P2P where there are two. Skipped without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/gather.h"
#include "memory/cuda/segment_copy.h"
#include "test_env.h"

namespace dmx::cuda {
namespace {

struct DevMem {
  void* p = nullptr;
  DevMem(int device, size_t size) {
    auto r = device_alloc(device, size);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (r.ok()) p = *r;
  }
  ~DevMem() { device_free(p); }
  char* c() const { return static_cast<char*>(p); }
};

std::vector<unsigned char> random_bytes(size_t n, std::mt19937_64& rng) {
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

struct Seg {
  uint64_t src, dst, len;
};

// Copies `segs` (offsets into a src of `size` bytes and a dst of `size` bytes) with one launch
// and checks every byte of dst: copied where a segment lands, untouched (its fresh random
// contents) elsewhere.
void run(const std::vector<Seg>& segs, size_t size, int src_dev, int dst_dev, std::mt19937_64& rng) {
  DevMem src(src_dev, size), dst(dst_dev, size);
  ASSERT_TRUE(src.p && dst.p);
  auto s = random_bytes(size, rng), d = random_bytes(size, rng);
  ASSERT_TRUE(copy_to_device(src.p, s.data(), size).ok());
  ASSERT_TRUE(copy_to_device(dst.p, d.data(), size).ok());
  std::vector<SegmentCopy> descs;
  for (const Seg& g : segs) {
    size_t at = descs.size();
    descs.resize(at + (g.len + kSegmentPiece - 1) / kSegmentPiece);
    split_segment(reinterpret_cast<uint64_t>(src.c() + g.src), reinterpret_cast<uint64_t>(dst.c() + g.dst), g.len,
                  descs.data() + at);
    std::memcpy(d.data() + g.dst, s.data() + g.src, g.len);
  }
  ASSERT_EQ(cudaSetDevice(dst_dev), cudaSuccess);  // the kernel runs where the bytes land
  DevMem on_gpu(dst_dev, std::max<size_t>(descs.size() * sizeof(SegmentCopy), 1));
  if (!descs.empty()) {
    ASSERT_TRUE(copy_to_device(on_gpu.p, descs.data(), descs.size() * sizeof(SegmentCopy)).ok());
  }
  ASSERT_TRUE(launch_segment_copy(static_cast<const SegmentCopy*>(on_gpu.p), descs.size(), nullptr).ok());
  std::vector<unsigned char> got(size);
  ASSERT_TRUE(copy_to_host(got.data(), dst.p, size).ok());  // synchronous: after the kernel
  for (size_t i = 0; i < size; ++i)
    if (got[i] != d[i]) FAIL() << "byte " << i << " of the destination differs";
}

TEST(GpuSegmentCopy, OddSizesAndOffsetsInEveryAlignment) {
  DMX_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng{std::random_device{}()};
  std::vector<Seg> segs;
  uint64_t s = 0, d = 0;
  for (uint64_t len : {0ull, 1ull, 3ull, 15ull, 16ull, 17ull, 31ull, 4095ull, 4097ull, 65535ull, 65536ull, 65537ull,
                       200001ull})
    for (uint64_t skew = 0; skew < 17; skew += 1) {  // every src-dst skew mod 16, and equal
      segs.push_back(Seg{s + skew, d + (skew * 7) % 16, len});
      s += len + 64;
      d += len + 64;
    }
  run(segs, std::max(s, d) + 64, 0, 0, rng);
}

TEST(GpuSegmentCopy, HundredThousandScatteredSegments) {
  DMX_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng{std::random_device{}()};
  constexpr uint64_t kN = 100000, kBlock = 1000;  // not a multiple of any word
  std::vector<uint64_t> a(kN), b(kN);
  std::iota(a.begin(), a.end(), 0);
  std::iota(b.begin(), b.end(), 0);
  std::shuffle(a.begin(), a.end(), rng);
  std::shuffle(b.begin(), b.end(), rng);
  std::vector<Seg> segs(kN);
  for (uint64_t i = 0; i < kN; ++i) segs[i] = Seg{a[i] * kBlock + 3, b[i] * kBlock + 5, kBlock - 8};
  run(segs, kN * kBlock, 0, 0, rng);
}

TEST(GpuSegmentCopy, GpuToGpu) {
  DMX_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng{std::random_device{}()};
  std::vector<Seg> segs;
  for (uint64_t i = 0; i < 4096; ++i) segs.push_back(Seg{(4095 - i) * 16384 + (i % 13), i * 16384 + (i % 7), 16000});
  // Two GPUs: the kernel on the second reads the first's memory by P2P (as the cuda_ipc receiver
  // does); one GPU: within it.
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  int src = 0, dst = n > 1 ? 1 : 0;
  if (n > 1) {
    int can = 0;
    ASSERT_EQ(cudaDeviceCanAccessPeer(&can, dst, src), cudaSuccess);
    if (!can) GTEST_SKIP() << "cuda:" << dst << " cannot reach cuda:" << src << " by P2P";
    ASSERT_EQ(cudaSetDevice(dst), cudaSuccess);
    cudaError_t e = cudaDeviceEnablePeerAccess(src, 0);
    ASSERT_TRUE(e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled) << cudaGetErrorString(e);
    (void)cudaGetLastError();
  }
  run(segs, 4096 * 16384, src, dst, rng);
}

}  // namespace
}  // namespace dmx::cuda
