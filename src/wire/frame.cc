#include "wire/frame.h"

#include <fmt/format.h>

#include "wire/le.h"

namespace dmx::wire {

HeaderBytes encode_header(const FrameHeader& h) {
  HeaderBytes b{};
  put_u32(b.data() + 0, kMagic);
  b[4] = static_cast<unsigned char>(h.type);
  b[5] = h.flags;
  b[6] = h.path;
  put_u32(b.data() + 8, h.payload_len);
  put_u32(b.data() + 12, h.crc);
  put_u64(b.data() + 16, h.id);
  put_u64(b.data() + 24, h.a0);
  put_u64(b.data() + 32, h.a1);
  put_u64(b.data() + 40, h.a2);
  put_u64(b.data() + 48, h.a3);
  return b;
}

std::string_view frame_type_name(FrameType t) {
  switch (t) {
    case FrameType::kHello: return "HELLO";
    case FrameType::kAuth: return "AUTH";
    case FrameType::kJoin: return "JOIN";
    case FrameType::kRejoin: return "REJOIN";
    case FrameType::kWelcome: return "WELCOME";
    case FrameType::kReject: return "REJECT";
    case FrameType::kEager: return "EAGER";
    case FrameType::kRts: return "RTS";
    case FrameType::kCts: return "CTS";
    case FrameType::kSendData: return "SEND_DATA";
    case FrameType::kCancel: return "CANCEL";
    case FrameType::kAck: return "ACK";
    case FrameType::kCredit: return "CREDIT";
    case FrameType::kWriteData: return "WRITE_DATA";
    case FrameType::kReadReq: return "READ_REQ";
    case FrameType::kReadData: return "READ_DATA";
    case FrameType::kPathDone: return "PATH_DONE";
    case FrameType::kKeepalive: return "KEEPALIVE";
    case FrameType::kClose: return "CLOSE";
    case FrameType::kLinkAck: return "LINK_ACK";
    case FrameType::kLinkDown: return "LINK_DOWN";
  }
  return "?";
}

namespace {

// The largest payload each type may carry; 0 means none at all.
Result<uint32_t> max_payload(FrameType t, const Limits& limits) {
  switch (t) {
    case FrameType::kHello:
    case FrameType::kJoin:
    case FrameType::kRejoin:
    case FrameType::kReject:
    case FrameType::kAck:
    case FrameType::kClose:
      return kMaxControlPayload;
    case FrameType::kAuth: return 32;
    case FrameType::kEager: return limits.max_eager;
    case FrameType::kSendData:
    case FrameType::kWriteData:
    case FrameType::kReadData:
      return limits.max_chunk;
    case FrameType::kWelcome:
    case FrameType::kRts:
    case FrameType::kCts:
    case FrameType::kCancel:
    case FrameType::kCredit:
    case FrameType::kReadReq:
    case FrameType::kPathDone:
    case FrameType::kKeepalive:
    case FrameType::kLinkAck:
    case FrameType::kLinkDown:
      return 0;
  }
  return Status(Code::kProtocol, fmt::format("unknown frame type {}", static_cast<int>(t)));
}

}  // namespace

Result<FrameHeader> decode_header(const unsigned char* b, const Limits& limits) {
  uint32_t magic = get_u32(b);
  if (magic != kMagic)
    return Status(Code::kProtocol, fmt::format("bad magic 0x{:08x} (not a dmx peer, or the stream is out of sync)", magic));
  FrameHeader h;
  h.type = static_cast<FrameType>(b[4]);
  h.flags = b[5];
  h.path = b[6];
  h.crc = get_u32(b + 12);
  if (b[7] != 0 || (h.crc != 0 && (h.flags & kFlagChecksum) == 0))
    return Status(Code::kProtocol, "reserved header fields are not zero");
  h.payload_len = get_u32(b + 8);
  h.id = get_u64(b + 16);
  h.a0 = get_u64(b + 24);
  h.a1 = get_u64(b + 32);
  h.a2 = get_u64(b + 40);
  h.a3 = get_u64(b + 48);
  DMX_ASSIGN_OR_RETURN(uint32_t max, max_payload(h.type, limits));
  bool data = is_chunk(h.type);
  auto allowed_flags = static_cast<uint8_t>(h.type == FrameType::kWriteData ? kFlagNotify | kFlagVector | kFlagTable
                                            : h.type == FrameType::kReadReq  ? kFlagVector | kFlagMore | kFlagTable
                                            : h.type == FrameType::kReadData ? kFlagTable
                                                                             : 0);
  if (carries_data(h.type)) allowed_flags |= kFlagChecksum;
  if ((h.flags & ~allowed_flags) != 0)
    return Status(Code::kProtocol, fmt::format("{} frame has unknown flags 0x{:02x}", frame_type_name(h.type), h.flags));
  // EAGER may name a path too: the receiver copies the message out of the sender's memory.
  if (h.path != 0 && !(data || h.type == FrameType::kEager))
    return Status(Code::kProtocol, fmt::format("{} frame names payload path {}", frame_type_name(h.type), h.path));
  if (h.path > kMaxPathId)
    return Status(Code::kProtocol, fmt::format("{} frame names payload path {} (at most {})", frame_type_name(h.type),
                                               h.path, kMaxPathId));
  if (h.path != 0) max = kMaxPathDescriptor;
  if ((h.flags & kFlagTable) && h.type == FrameType::kReadReq) {
    // A vectored read's segments, a table of them and nothing else (docs/wire.md).
    if ((h.flags & kFlagVector) == 0 || h.a0 == 0 || h.a0 > kMaxTableEntries || h.a1 != 0 || h.a2 != 0)
      return Status(Code::kProtocol, fmt::format("a READ_REQ table of {} segments (1 to {}, VECTOR, a1 {} and a2 {} 0)",
                                                 h.a0, kMaxTableEntries, h.a1, h.a2));
    if (h.payload_len != h.a0 * kTableEntrySize)
      return Status(Code::kProtocol, fmt::format("a READ_REQ table of {} segments carries {} bytes, not {}", h.a0,
                                                 h.payload_len, h.a0 * kTableEntrySize));
    max = h.payload_len;
  } else if (h.flags & kFlagTable) {
    // A vectored write's or read's pieces by a path (the path's descriptor follows the table), or
    // inline (their bytes follow it); no checksum (docs/wire.md).
    bool write = h.type == FrameType::kWriteData;
    if ((write && (h.flags & kFlagVector) == 0) || (h.flags & kFlagChecksum) != 0)
      return Status(Code::kProtocol, "a TABLE chunk must carry no CHECKSUM and be VECTOR if a write");
    const uint64_t n = table_pieces(h);
    if (n == 0 || n > kMaxTableEntries || (write && h.a1 != 0))
      return Status(Code::kProtocol, fmt::format("a TABLE chunk of {} pieces (1 to {}{})", n, kMaxTableEntries,
                                                 write ? fmt::format("; a1 {} must be 0", h.a1) : ""));
    if (h.path == 0) {  // inline: every piece has at least one byte; the chunk's limit holds
      if (h.payload_len < n * (kTableEntrySize + 1))
        return Status(Code::kProtocol, fmt::format("an inline TABLE chunk of {} pieces carries {} bytes", n,
                                                   h.payload_len));
    } else {
      if (h.payload_len <= n * kTableEntrySize)
        return Status(Code::kProtocol, fmt::format("a TABLE chunk of {} pieces carries {} bytes, no room for a "
                                                   "descriptor",
                                                   n, h.payload_len));
      max = static_cast<uint32_t>(n) * kTableEntrySize + kMaxTableDescriptor;
    }
  }
  if (h.payload_len > max)
    return Status(Code::kProtocol, fmt::format("{} frame carries {} payload bytes; the limit is {}",
                                               frame_type_name(h.type), h.payload_len, max));
  return h;
}

std::string describe(const FrameHeader& h) {
  return fmt::format("{}(id={}, a0={}, a1={}, a2={}, len={}{}{})", frame_type_name(h.type), h.id, h.a0, h.a1, h.a2,
                     h.payload_len, h.path != 0 ? fmt::format(", path={}", h.path) : "",
                     (h.flags & kFlagChecksum) ? fmt::format(", crc32c={:08x}", h.crc) : "");
}

}  // namespace dmx::wire
