#include "core/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace dmx::crc32c {

namespace {

// Slice-by-8 tables: kTables[k][b] is the raw CRC of byte b followed by k zero bytes.
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  constexpr Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (kPoly & (0u - (c & 1)));
      t[0][b] = c;
    }
    for (size_t k = 1; k < 8; ++k)
      for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  }
};
constexpr Tables kTables;

// x^(2^k) modulo the polynomial, k = 0..63: zeros_operator squares its way up with these.
struct Powers {
  std::array<uint32_t, 64> p{};
  constexpr Powers() {
    p[0] = 1u << 30;  // x^1
    for (size_t k = 1; k < 64; ++k) p[k] = multiply_c(p[k - 1], p[k - 1]);
  }
  static constexpr uint32_t multiply_c(uint32_t a, uint32_t b) {
    uint32_t m = 1u << 31, r = 0;
    for (; m != 0; m >>= 1) {
      if (a & m) r ^= b;
      b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
    }
    return r;
  }
};
constexpr Powers kPowers;

// The register (not inverted) over n bytes, tables only.
uint32_t soft(uint32_t s, const unsigned char* p, size_t n) {
  const auto& t = kTables.t;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);  // little-endian hosts only (x86-64, aarch64)
    v ^= s;
    s = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^ t[4][(v >> 24) & 0xff] ^
        t[3][(v >> 32) & 0xff] ^ t[2][(v >> 40) & 0xff] ^ t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
  }
  for (; n > 0; --n, ++p) s = (s >> 8) ^ t[0][(s ^ *p) & 0xff];
  return s;
}

#if defined(__x86_64__)
// Three independent chains hide the instruction's 3-cycle latency; their registers are joined with
// the zeros operators of one and two lane lengths.
constexpr size_t kLane = 8192;

__attribute__((target("sse4.2"))) uint32_t hard(uint32_t s, const unsigned char* p, size_t n) {
  static const uint32_t op1 = zeros_operator(kLane), op2 = zeros_operator(2 * kLane);
  uint64_t a = s;
  while (n >= 3 * kLane) {
    uint64_t b = 0, c = 0;
    for (size_t i = 0; i < kLane; i += 8) {
      uint64_t x, y, z;
      std::memcpy(&x, p + i, 8);
      std::memcpy(&y, p + kLane + i, 8);
      std::memcpy(&z, p + 2 * kLane + i, 8);
      a = _mm_crc32_u64(a, x);
      b = _mm_crc32_u64(b, y);
      c = _mm_crc32_u64(c, z);
    }
    a = multiply(op2, static_cast<uint32_t>(a)) ^ multiply(op1, static_cast<uint32_t>(b)) ^ static_cast<uint32_t>(c);
    p += 3 * kLane;
    n -= 3 * kLane;
  }
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t x;
    std::memcpy(&x, p, 8);
    a = _mm_crc32_u64(a, x);
  }
  uint32_t r = static_cast<uint32_t>(a);
  for (; n > 0; --n, ++p) r = _mm_crc32_u8(r, *p);
  return r;
}

const bool kHardware = __builtin_cpu_supports("sse4.2");
#else
const bool kHardware = false;
#endif

}  // namespace

uint32_t multiply(uint32_t a, uint32_t b) { return Powers::multiply_c(a, b); }

uint32_t zeros_operator(uint64_t n) {
  uint32_t r = 1u << 31;  // x^0
  for (size_t k = 3; n != 0; n >>= 1, ++k)  // 8 n = n << 3: start at x^(2^3)
    if (n & 1) r = multiply(kPowers.p[k & 63], r);
  return r;
}

uint32_t extend(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  if (kHardware) return ~hard(~crc, p, n);
#endif
  return ~soft(~crc, p, n);
}

}  // namespace dmx::crc32c
