// stream_copy: byte-exact like memcpy at every alignment of source and destination, every length
// around the 16-byte head and the 64-byte loop, and beyond; bytes outside the range untouched.
#include "core/stream_copy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace dmx {
namespace {

std::vector<unsigned char> fresh(size_t n) {
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 g(seed);
  std::vector<unsigned char> v(n);
  for (auto& c : v) c = static_cast<unsigned char>(g());
  return v;
}

TEST(StreamCopy, ByteExactAtEveryAlignmentAndLength) {
  constexpr size_t kMax = 300;
  std::vector<unsigned char> src = fresh(kMax + 64);
  for (size_t so = 0; so < 16; ++so) {
    for (size_t d0 = 0; d0 < 16; ++d0) {
      for (size_t n = 0; n <= kMax; ++n) {
        std::vector<unsigned char> dst(kMax + 64, 0xA5);
        stream_copy(dst.data() + d0, src.data() + so, n);
        std::vector<unsigned char> want(dst.size(), 0xA5);
        std::memcpy(want.data() + d0, src.data() + so, n);
        if (dst == want) continue;
        for (size_t i = 0; i < dst.size(); ++i) {  // the first wrong byte, named
          bool inside = i >= d0 && i < d0 + n;
          unsigned char want = inside ? src[so + i - d0] : 0xA5;
          ASSERT_EQ(dst[i], want) << "src offset " << so << ", dst offset " << d0 << ", length " << n << ", byte " << i;
        }
      }
    }
  }
}

TEST(StreamCopy, LargeOddCopy) {
  const size_t n = (9u << 20) + 13;
  std::vector<unsigned char> src = fresh(n + 3), dst(n + 8, 0xA5);
  stream_copy(dst.data() + 5, src.data() + 3, n);
  EXPECT_TRUE(std::equal(src.begin() + 3, src.begin() + 3 + static_cast<long>(n), dst.begin() + 5));
  EXPECT_EQ(dst[4], 0xA5);
  EXPECT_EQ(dst[5 + n], 0xA5);
}

}  // namespace
}  // namespace dmx
