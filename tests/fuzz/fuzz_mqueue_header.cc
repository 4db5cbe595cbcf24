// Fuzzes the Lynx request header check (src/mqueue/request_header.h), which the dispatcher and
// the host-centric baseline run on every TCP frame and UDP datagram a client sends. Input: a
// 9-byte prefix choosing the limit and the framing (max_request u32, datagram flag, datagram
// size u32 added to the bytes given), then the bytes as received. A header that passes must be
// within every bound the servers rely on; one that fails must say why.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "mqueue/request_header.h"

using namespace dmx::mqueue;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 9) return 0;
  uint32_t max_request, extra;
  std::memcpy(&max_request, data, 4);
  const uint8_t flags = data[4];
  std::memcpy(&extra, data + 5, 4);
  data += 9;
  size -= 9;
  Framing f;
  f.datagram = flags & 1;
  f.truncated = flags & 2;
  f.datagram_bytes = uint64_t{size} + ((flags & 4) ? extra : 0);  // a datagram longer than the buffer
  CheckedHeader c = check_request_header(data, size, max_request, f);
  if (c.ok() != c.why.empty()) std::abort();
  if (!c.ok()) return 0;
  if (size < sizeof(WireHeader)) std::abort();
  if (c.header.magic != kRequestMagic || c.header.len > max_request) std::abort();
  if (f.datagram && (f.truncated || uint64_t{c.header.len} + sizeof(WireHeader) != f.datagram_bytes)) std::abort();
  WireHeader raw;
  std::memcpy(&raw, data, sizeof raw);
  if (raw.len != c.header.len || raw.tag != c.header.tag) std::abort();
  return 0;
}
