#include "mqueue/request_header.h"

#include <cstdio>
#include <cstring>

namespace dmx::mqueue {

CheckedHeader check_request_header(const uint8_t* data, size_t size, uint32_t max_request, Framing framing) {
  CheckedHeader c;
  const uint64_t have = framing.datagram ? framing.datagram_bytes : size;
  if (size < sizeof(WireHeader) || have < sizeof(WireHeader)) {
    c.verdict = HeaderVerdict::kShort;
    c.why = std::to_string(framing.datagram ? have : size) + " B, shorter than the 16-byte header";
    return c;
  }
  std::memcpy(&c.header, data, sizeof c.header);  // little-endian on every host we build for
  if (c.header.magic != kRequestMagic) {
    char b[16];
    std::snprintf(b, sizeof b, "0x%08x", c.header.magic);
    c.verdict = HeaderVerdict::kBadMagic;
    c.why = std::string("bad magic ") + b;
    return c;
  }
  if (framing.datagram && framing.truncated) {
    c.verdict = HeaderVerdict::kOverLimit;
    c.why = "over the " + std::to_string(max_request) + " B request limit";
    return c;
  }
  if (c.header.len > max_request) {
    c.verdict = HeaderVerdict::kOverLimit;
    c.why = "request length " + std::to_string(c.header.len) + " over the limit " + std::to_string(max_request);
    return c;
  }
  // have >= 16 here; both sides are 64-bit, so neither the difference nor len can wrap.
  if (framing.datagram && uint64_t{c.header.len} != have - sizeof(WireHeader)) {
    c.verdict = HeaderVerdict::kLengthMismatch;
    c.why =
        "header says " + std::to_string(c.header.len) + " B, datagram has " + std::to_string(have - sizeof(WireHeader));
    return c;
  }
  c.verdict = HeaderVerdict::kOk;
  return c;
}

}  // namespace dmx::mqueue
