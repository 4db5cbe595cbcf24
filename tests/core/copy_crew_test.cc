// CopyCrew: byte-exact like memcpy at odd sizes and offsets, with ordinary and non-temporal stores;
// bytes around the destination untouched; lists of segments; callers at once; helpers start at the
// first shared copy, take part, and are gone with the crew; run() calls every piece once.
#include "core/copy_crew.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "proc_threads.h"

namespace dmx {
namespace {

constexpr size_t kPiece = CopyCrew::kDefaultPiece;

std::vector<unsigned char> fresh(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t x = g();
    std::memcpy(&v[i], &x, 8);
  }
  for (size_t i = n / 8 * 8; i < n; ++i) v[i] = static_cast<unsigned char>(g());
  return v;
}

uint64_t run_seed() {
  static const uint64_t seed = [] {
    uint64_t s = std::random_device{}();
    std::printf("seed %llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

// Copies n bytes from src+so to dst+dso through `crew`; checks them and 64 guard bytes each side.
void check_copy(CopyCrew& crew, size_t n, size_t so, size_t dso, bool nt, uint64_t seed) {
  std::vector<unsigned char> src = fresh(n + so, seed);
  std::vector<unsigned char> dst(n + dso + 128, 0xEE);
  crew.copy(dst.data() + 64 + dso, src.data() + so, n, nt);
  ASSERT_TRUE(n == 0 || std::memcmp(dst.data() + 64 + dso, src.data() + so, n) == 0)
      << "n " << n << " so " << so << " dso " << dso << " nt " << nt;
  for (size_t i = 0; i < 64 + dso; ++i) ASSERT_EQ(dst[i], 0xEE) << "before, n " << n;
  for (size_t i = 64 + dso + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xEE) << "after, n " << n;
}

TEST(CopyCrew, ByteExactAtOddSizesAndOffsets) {
  const size_t sizes[] = {0, 1, 63, kPiece - 1, kPiece, kPiece + 1, 2 * kPiece - 1, 2 * kPiece,
                          2 * kPiece + 1, 3 * kPiece + 17, (4u << 20) + 3, (17u << 20) + 4093};
  const std::pair<size_t, size_t> offsets[] = {{0, 0}, {1, 7}, {13, 0}, {4093, 33}};
  for (int threads : {1, 2, 4}) {
    CopyCrew crew(threads);
    EXPECT_EQ(crew.threads(), threads);
    uint64_t seed = run_seed() + threads;
    for (size_t n : sizes)
      for (auto [so, dso] : offsets)
        for (bool nt : {false, true}) check_copy(crew, n, so, dso, nt, seed++);
  }
}

// More pieces than one job holds (0xffff): with 64-byte pieces a job covers 4 MiB - 64 B, so
// these copies take two and three jobs.
TEST(CopyCrew, CopiesLargerThanOneJob) {
  CopyCrew crew(3, 64);
  uint64_t seed = run_seed() + 100;
  for (size_t n : {size_t{0xffff} * 64, size_t{0xffff} * 64 + 1, size_t{10u << 20} + 33})
    for (bool nt : {false, true}) check_copy(crew, n, 5, 3, nt, seed++);
}

TEST(CopyCrew, CallersAtOnceEachGetTheirBytes) {
  CopyCrew crew(3);
  std::vector<std::thread> callers;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        size_t n = (1u << 20) + size_t(t) * 4099 + size_t(i) * 61;
        std::vector<unsigned char> src = fresh(n, run_seed() + 1000 + t * 100 + i), dst(n + 1, 0xEE);
        crew.copy(dst.data() + 1, src.data(), n, (i & 1) != 0);
        if (std::memcmp(dst.data() + 1, src.data(), n) != 0 || dst[0] != 0xEE) bad.fetch_add(1);
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(CopyCrew, HelpersStartAtTheFirstSharedCopyTakePartAndEndWithTheCrew) {
  const int before = process_threads("dmx-copy");
  ASSERT_GE(before, 0);
  {
    auto crew = std::make_unique<CopyCrew>(3);
    std::vector<unsigned char> src = fresh(8u << 20, run_seed() + 7), dst(8u << 20);
    crew->copy(dst.data(), src.data(), 2 * kPiece - 1, false);  // the caller's alone
    EXPECT_EQ(process_threads("dmx-copy"), before);
    EXPECT_EQ(crew->shared_copies(), 0u);
    // A helper asleep when a copy starts may miss it: copy until one took part (a deadline, not a
    // race: each copy is correct either way).
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (crew->helper_pieces() == 0 && std::chrono::steady_clock::now() < until) {
      crew->copy(dst.data(), src.data(), src.size(), false);
      ASSERT_EQ(std::memcmp(dst.data(), src.data(), src.size()), 0);
    }
    EXPECT_GT(crew->helper_pieces(), 0u);
    EXPECT_GT(crew->shared_copies(), 0u);
    EXPECT_EQ(process_threads("dmx-copy"), before + 2);
  }
  EXPECT_EQ(process_threads("dmx-copy"), before);
}

// A list of segments (a KV-cache list's pieces): odd sizes from 1 B to 1 MiB, empty ones, sources
// and destinations scattered in reverse order, guard bytes between them untouched; lists below two
// pieces stay the caller's, larger ones are shared until a helper took part.
TEST(CopyCrew, SegmentsByteExactAndShared) {
  for (int threads : {1, 3}) {
    CopyCrew crew(threads);
    std::mt19937_64 g(run_seed() + 200 + threads);
    for (size_t count : {size_t{1}, size_t{7}, size_t{300}, size_t{1024}}) {
      for (bool nt : {false, true}) {
        std::vector<size_t> sizes(count);
        size_t total = 0;
        for (size_t& n : sizes) total += n = g() % 5 == 0 ? 0 : 1 + g() % (count < 300 ? (1u << 20) : 9000);
        std::vector<unsigned char> src = fresh(total + 3 * count, g()), dst(total + 5 * count + 64, 0xEE);
        std::vector<unsigned char> want = dst;
        std::vector<CopyCrew::Segment> segs;
        size_t s_at = 0, d_at = dst.size();
        for (size_t n : sizes) {
          s_at += 3;
          d_at -= n + 5;
          segs.push_back({dst.data() + d_at, src.data() + s_at, n});
          std::memcpy(want.data() + d_at, src.data() + s_at, n);
          s_at += n;
        }
        crew.copy(segs, nt);
        ASSERT_TRUE(dst == want) << count << " segments, nt " << nt << ", threads " << threads;
      }
    }
  }
  CopyCrew crew(3);
  std::vector<unsigned char> src = fresh(8u << 20, run_seed() + 300), dst(8u << 20);
  std::vector<CopyCrew::Segment> segs;
  for (size_t at = 0; at < src.size(); at += 16384) segs.push_back({dst.data() + at, src.data() + at, 16384});
  crew.copy(std::span(segs).first(2 * kPiece / 16384 - 1), false);  // under two pieces: the caller's
  EXPECT_EQ(crew.shared_copies(), 0u);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (crew.helper_pieces() == 0 && std::chrono::steady_clock::now() < until) {
    std::fill(dst.begin(), dst.end(), 0);
    crew.copy(std::span(segs).first(256), false);  // 4 MiB of 16 KiB segments
    ASSERT_EQ(std::memcmp(dst.data(), src.data(), 4u << 20), 0);
  }
  EXPECT_GT(crew.helper_pieces(), 0u);
  EXPECT_GT(crew.shared_copies(), 0u);
}

// run(): every piece once, at any count (more than one job's 65,535 included), from callers at
// once; helpers take part.
TEST(CopyCrew, RunCallsEveryPieceOnce) {
  for (int threads : {1, 2, 4}) {
    CopyCrew crew(threads);
    for (size_t pieces : {0u, 1u, 2u, 100u, 70000u}) {
      std::vector<std::atomic<int>> calls(pieces);
      crew.run(pieces, [&](size_t i) { calls[i].fetch_add(1, std::memory_order_relaxed); });
      for (size_t i = 0; i < pieces; ++i) ASSERT_EQ(calls[i].load(), 1) << "threads " << threads << " piece " << i;
    }
  }
  CopyCrew crew(3);
  std::vector<std::thread> callers;
  std::atomic<int> wrong{0};
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int round = 0; round < 50; ++round) {
        std::vector<std::atomic<int>> calls(300);
        crew.run(calls.size(), [&](size_t i) { calls[i].fetch_add(1, std::memory_order_relaxed); });
        for (auto& n : calls)
          if (n.load() != 1) wrong.fetch_add(1);
      }
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(wrong.load(), 0);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (crew.helper_pieces() == 0 && std::chrono::steady_clock::now() < until) {
    std::atomic<int> sum{0};
    crew.run(64, [&](size_t i) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      sum.fetch_add(static_cast<int>(i));
    });
    ASSERT_EQ(sum.load(), 64 * 63 / 2);
  }
  EXPECT_GT(crew.helper_pieces(), 0u);
}

TEST(CopyCrew, OneThreadHasNoHelpers) {
  const int before = process_threads("dmx-copy");
  CopyCrew crew(1);
  std::vector<unsigned char> src = fresh(4u << 20, run_seed() + 9), dst(4u << 20);
  crew.copy(dst.data(), src.data(), src.size(), true);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), src.size()), 0);
  EXPECT_EQ(process_threads("dmx-copy"), before);
  EXPECT_EQ(crew.helper_pieces(), 0u);
}

}  // namespace
}  // namespace dmx
