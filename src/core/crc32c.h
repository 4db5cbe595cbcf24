// CRC32C (Castagnoli, reflected polynomial 0x82F63B78; init and final xor ~0, as iSCSI and ext4),
// and the algebra that combines the CRCs of pieces into the CRC of the whole, in any order.
//
// Two forms: the standard CRC of a byte string, and its "raw" form (register starting at 0, no
// final xor). Raw CRCs are linear: the raw CRC of A||B is shift(raw(A), |B|) ^ raw(B), and leading
// zero bytes do not change it. So chunks that land out of order fold into one transfer's CRC with
// fold(), and a device kernel can split a buffer over many threads (src/memory/cuda/crc32c.cu).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dmx::crc32c {

inline constexpr uint32_t kPoly = 0x82F63B78u;  // reflected

// The standard CRC32C of `n` bytes, continuing from `crc` (the standard CRC of what came before;
// 0 for a start). Hardware CRC instructions when the CPU has them (SSE4.2), else tables.
uint32_t extend(uint32_t crc, const void* data, size_t n);
inline uint32_t of(const void* data, size_t n) { return extend(0, data, n); }

// (a * b) modulo the polynomial, both in the reflected representation (x^0 is bit 31).
uint32_t multiply(uint32_t a, uint32_t b);
// x^(8 n) modulo the polynomial: multiplying a raw CRC by it appends n zero bytes.
uint32_t zeros_operator(uint64_t n);
// The raw CRC `raw` followed by n zero bytes.
inline uint32_t shift(uint32_t raw, uint64_t n) { return multiply(zeros_operator(n), raw); }

// Standard <-> raw for a string of n bytes.
inline uint32_t to_raw(uint32_t crc, uint64_t n) { return ~crc ^ shift(0xFFFFFFFFu, n); }
inline uint32_t from_raw(uint32_t raw, uint64_t n) { return ~(raw ^ shift(0xFFFFFFFFu, n)); }

// The standard CRC of A||B from the standard CRCs of A and B, and |B|.
inline uint32_t combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return multiply(zeros_operator(len_b), crc_a) ^ crc_b;
}

// A transfer's CRC folded from its chunks in any order: `acc` (a raw CRC, 0 to start) takes the
// chunk of `len` bytes at `offset` of a `total`-byte transfer whose standard CRC is `crc`, moved to
// the transfer's end; from_raw(acc, total) is the transfer's CRC once every chunk was folded.
inline uint32_t fold(uint32_t acc, uint64_t total, uint64_t offset, uint64_t len, uint32_t crc) {
  return acc ^ shift(to_raw(crc, len), total - offset - len);
}

}  // namespace dmx::crc32c
