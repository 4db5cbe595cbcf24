#include "core/crc32c.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace dmx {
namespace {

// Bit by bit, straight from the definition: the reference every fast form must equal.
uint32_t reference(const unsigned char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (crc32c::kPoly & (0u - (c & 1)));
  }
  return ~c;
}

std::vector<unsigned char> random_bytes(size_t n, std::mt19937_64& rng) {
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

TEST(Crc32c, KnownVectors) {
  const char* digits = "123456789";
  EXPECT_EQ(crc32c::of(digits, 9), 0xE3069283u);  // the check value of CRC-32C
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xff);
  EXPECT_EQ(crc32c::of(zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(crc32c::of(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c::of(nullptr, 0), 0u);
}

TEST(Crc32c, EqualsTheBitwiseReferenceAtEverySizeAndOffset) {
  std::mt19937_64 rng(std::random_device{}());
  // Past three lanes of 8 KiB, so the interleaved hardware loop and its join run too.
  auto data = random_bytes(3 * 8192 * 2 + 4099, rng);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{63}, size_t{4096}, size_t{3 * 8192 - 1},
                   size_t{3 * 8192}, size_t{3 * 8192 + 1}, size_t{6 * 8192 + 13}})
    for (size_t off : {size_t{0}, size_t{1}, size_t{3}, size_t{7}}) {
      ASSERT_LE(off + n, data.size());
      EXPECT_EQ(crc32c::of(data.data() + off, n), reference(data.data() + off, n)) << n << " at " << off;
    }
}

TEST(Crc32c, ExtendCombineAndRawAgree) {
  std::mt19937_64 rng(std::random_device{}());
  auto data = random_bytes(100'003, rng);
  const uint32_t whole = crc32c::of(data.data(), data.size());
  for (int i = 0; i < 20; ++i) {
    size_t cut = rng() % (data.size() + 1);
    uint32_t a = crc32c::of(data.data(), cut), b = crc32c::of(data.data() + cut, data.size() - cut);
    EXPECT_EQ(crc32c::extend(a, data.data() + cut, data.size() - cut), whole);
    EXPECT_EQ(crc32c::combine(a, b, data.size() - cut), whole);
    EXPECT_EQ(crc32c::from_raw(crc32c::to_raw(a, cut), cut), a);
  }
}

TEST(Crc32c, FoldTakesChunksInAnyOrder) {
  std::mt19937_64 rng(std::random_device{}());
  for (size_t total : {size_t{0}, size_t{1}, size_t{65'537}, size_t{1'000'003}}) {
    auto data = random_bytes(total, rng);
    std::vector<std::pair<size_t, size_t>> chunks;  // offset, length
    for (size_t off = 0; off < total;) {
      size_t len = std::min<size_t>(total - off, 1 + rng() % 70'000);
      chunks.emplace_back(off, len);
      off += len;
    }
    std::shuffle(chunks.begin(), chunks.end(), rng);
    uint32_t acc = 0;
    for (auto [off, len] : chunks) acc = crc32c::fold(acc, total, off, len, crc32c::of(data.data() + off, len));
    EXPECT_EQ(crc32c::from_raw(acc, total), crc32c::of(data.data(), total)) << total;
  }
}

TEST(Crc32c, OneFlippedBitChangesIt) {
  std::mt19937_64 rng(std::random_device{}());
  auto data = random_bytes(1 << 20, rng);
  const uint32_t before = crc32c::of(data.data(), data.size());
  data[rng() % data.size()] ^= static_cast<unsigned char>(1u << (rng() % 8));
  EXPECT_NE(crc32c::of(data.data(), data.size()), before);
}

}  // namespace
}  // namespace dmx
