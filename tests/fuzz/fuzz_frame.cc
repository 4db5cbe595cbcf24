// Fuzzes wire::decode_header, the first thing that reads a peer's bytes on every stream. The
// input is 8 bytes of limits then the 56-byte header. A header that decodes must satisfy the
// limits it was checked against and re-encode to the same bytes (decoding loses nothing that
// matters: reserved fields are zero).
#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "wire/frame.h"

using namespace dmx::wire;

namespace {

// The payload limit restated from docs/wire.md, independently of frame.cc's table.
uint32_t independent_limit(const FrameHeader& h, const Limits& l) {
  // A TABLE chunk: a0 (a write's) or a2 (a read's) pieces of 20 B, then a list descriptor (the
  // count checked by the caller first); inline (path 0): a chunk.
  if ((h.flags & kFlagTable) && h.type == FrameType::kReadReq) return static_cast<uint32_t>(h.a0) * 20;
  if ((h.flags & kFlagTable) && h.path == 0) return l.max_chunk;
  if (h.flags & kFlagTable) return static_cast<uint32_t>(h.type == FrameType::kReadData ? h.a2 : h.a0) * 20 + 8704;
  if (h.path != 0) return kMaxPathDescriptor;
  switch (h.type) {
    case FrameType::kHello: case FrameType::kJoin: case FrameType::kReject: case FrameType::kAck:
    case FrameType::kClose: case FrameType::kRejoin: return kMaxControlPayload;
    case FrameType::kAuth: return 32;
    case FrameType::kEager: return l.max_eager;
    case FrameType::kSendData: case FrameType::kWriteData: case FrameType::kReadData: return l.max_chunk;
    default: return 0;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8 + kHeaderSize) return 0;
  Limits limits;
  std::memcpy(&limits.max_chunk, data, 4);
  std::memcpy(&limits.max_eager, data + 4, 4);
  const unsigned char* bytes = data + 8;
  // Also the limits the handshake uses (nothing may carry payload but control frames).
  for (Limits l : {limits, Limits{0, 0}}) {
    auto h = decode_header(bytes, l);
    if (!h.ok()) {
      if (h.status().code() != dmx::Code::kProtocol) std::abort();
      continue;
    }
    (void)describe(*h);
    (void)frame_type_name(h->type);
    HeaderBytes again = encode_header(*h);
    if (std::memcmp(again.data(), bytes, kHeaderSize) != 0) std::abort();
    // TABLE (docs/wire.md "Tables"): a vectored WRITE_DATA, no CHECKSUM, 1 to 1,024 pieces in
    // a0, a1 0; or a READ_DATA, no CHECKSUM, 1 to 1,024 pieces in a2. By a path: room for the
    // table and a descriptor; inline (path 0, version 12 for reads): for the table and a byte a
    // piece.
    if ((h->flags & kFlagTable) && h->type == FrameType::kReadReq) {
      // A READ_REQ table: VECTOR, 1 to 1,024 segments in a0, a1 and a2 0, exactly their entries.
      if ((h->flags & kFlagVector) == 0 || h->a0 == 0 || h->a0 > 1024 || h->a1 != 0 || h->a2 != 0 ||
          h->payload_len != h->a0 * 20)
        std::abort();
    } else if (h->flags & kFlagTable) {
      bool write = h->type == FrameType::kWriteData;
      uint64_t n = write ? h->a0 : h->a2;
      if ((!write && h->type != FrameType::kReadData) || (write && ((h->flags & kFlagVector) == 0 || h->a1 != 0)) ||
          (h->flags & kFlagChecksum) != 0 || n == 0 || n > 1024 ||
          (h->path != 0 && h->payload_len <= n * 20) || (h->path == 0 && h->payload_len < n * 21))
        std::abort();
    }
    if (h->payload_len > independent_limit(*h, l)) std::abort();
    // A path only on data frames and EAGER, and only an id the wire allows.
    bool carries = h->type == FrameType::kSendData || h->type == FrameType::kWriteData ||
                   h->type == FrameType::kReadData || h->type == FrameType::kEager;
    if (h->path > kMaxPathId || (h->path != 0 && !carries)) std::abort();
  }
  return 0;
}
