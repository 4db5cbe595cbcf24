// mqueue/request_header.h — the one check of a client's request header (WireHeader, layout.h),
// shared by the dispatcher, the baseline and the fuzz target (tests/fuzz/fuzz_mqueue_header.cc).
// A pure function: no I/O, no allocation beyond the reason text; every size in 64-bit arithmetic,
// so a length field near 2^32 cannot wrap a sum or a difference.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "mqueue/layout.h"

namespace dmx::mqueue {

enum class HeaderVerdict : uint8_t {
  kOk,
  kShort,           // fewer than 16 bytes
  kBadMagic,        // not "LYNX"
  kOverLimit,       // len over max_request (or a datagram truncated by the receive buffer)
  kLengthMismatch,  // datagram only: len disagrees with the bytes that came after the header
};

struct CheckedHeader {
  HeaderVerdict verdict = HeaderVerdict::kShort;
  WireHeader header{};  // decoded when at least 16 bytes were given
  std::string why;      // empty when kOk: "bad magic 0x00000000", "request length 5000 over the limit 4096"
  bool ok() const { return verdict == HeaderVerdict::kOk; }
};

// How the bytes came: a TCP stream (only the header is checked; the payload follows later) or a
// whole UDP datagram of `datagram_bytes` (may exceed `size` when the receive buffer truncated it).
struct Framing {
  bool datagram = false;
  uint64_t datagram_bytes = 0;
  bool truncated = false;  // the kernel said MSG_TRUNC
};

// Checks the first min(size, 16) bytes of `data` as a request header against `max_request`.
CheckedHeader check_request_header(const uint8_t* data, size_t size, uint32_t max_request, Framing framing = {});

}  // namespace dmx::mqueue
