// Overflow-safe arithmetic for sizes and offsets that a peer (or a user) can influence.
// Every size computed from untrusted numbers goes through these: no silent wrap of 2^64.
#pragma once

#include <cstdint>
#include <optional>

namespace dmx {

inline std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// Whether [offset, offset + length) lies inside [0, size), written so that it cannot wrap.
inline bool range_fits(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

}  // namespace dmx
