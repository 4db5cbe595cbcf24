// The dmx frame: a fixed 56-byte header in host memory, followed by `payload_len` payload bytes
// that live wherever the user's memory is (header/payload split). Pure code, no I/O.
//
// Layout (all integers little-endian):
//   0  u32 magic        "DMX1"
//   4  u8  type         FrameType
//   5  u8  flags        FrameFlags
//   6  u8  path         data frames and EAGER: 0 = the payload follows the header; k = the payload
//                       went by the k-th transport agreed in the handshake, and the frame's payload
//                       is that path's descriptor of the chunk (≤ kMaxPathDescriptor bytes)
//   7  u8  reserved     must be 0
//   8  u32 payload_len  bytes that follow the header
//   12 u32 crc32c       with kFlagChecksum: the CRC32C of the chunk's bytes; else must be 0
//   16 u64 id           message / operation / token id (meaning per type)
//   24 u64 a0, 32 u64 a1, 40 u64 a2, 48 u64 a3   arguments (meaning per type, see docs/wire.md)
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "dmx/status.h"
#include "wire/le.h"

namespace dmx::wire {

inline constexpr uint32_t kMagic = 0x31584d44;  // bytes 'D' 'M' 'X' '1'
inline constexpr uint16_t kProtocolVersion = 12;  // 8: REJOIN (reconnect_timeout); 9: TABLE; 10: read tables,
                                                  // READ_REQ tables; 11: inline write tables; 12: inline
                                                  // read tables
inline constexpr size_t kHeaderSize = 56;
inline constexpr uint32_t kMaxControlPayload = 4096;  // handshake, ack texts, reject reasons

enum class FrameType : uint8_t {
  // Handshake (stream set-up only).
  kHello = 1,    // payload: Hello
  kAuth = 2,     // payload: 32-byte client proof
  kJoin = 3,     // payload: Join (an extra stream of an existing endpoint)
  kWelcome = 4,  // handshake accepted; no payload
  kReject = 5,   // handshake refused; payload: reason text
  kRejoin = 6,   // payload: Rejoin (a new stream of a live endpoint that lost its streams)
  // Two-sided messages.
  kEager = 16,     // id=msg seq, a0=tag; payload = the whole message (or a path's descriptor of it)
  kRts = 17,       // id=msg seq, a0=tag, a1=size
  kCts = 18,       // id=msg seq, a0=receiver token, a1=accepting paths (bit k: path k)
  kSendData = 19,  // id=receiver token, a0=offset, a1=message size; payload = chunk
  kCancel = 20,    // id=msg seq or write op, a0=bytes the sender handed out, a1=OpKind
  kAck = 21,       // id=msg seq / op id, a0=status code, a1=OpKind; payload: error text
  kCredit = 22,    // a0=eager bytes the receiver has consumed
  // One-sided operations.
  kWriteData = 24,  // id=op id, a0=remote key, a1=remote offset, a2=op length, a3=notify value
  kReadReq = 25,    // id=op id, a0=remote key, a1=remote offset, a2=length, a3=accepting paths
                    // (with kFlagTable: a0 segments in the payload, a1=a2=0)
  kReadData = 26,   // id=op id, a0=offset in op, a1=op length; payload = chunk
  kPathDone = 27,   // id=path sequence number, a0=path id: the receiver is done with a chunk the
                    // sender lent through a path that releases at the receiver (cuda_ipc)
  // Liveness.
  kKeepalive = 30,
  kClose = 31,  // orderly close; payload: reason text
  // Several links (Hello::multilink), on the control stream; a2 = the peer's control frames landed here.
  kLinkAck = 32,   // a0=data stream (0: a2 only), a1=data frames that stream has landed here in all
  kLinkDown = 33,  // a0=stream, a1=data frames it landed: this side lands nothing more from it
};

enum FrameFlags : uint8_t {
  kFlagNotify = 1,    // kWriteData: deliver a notification to the target when the write has landed
  kFlagChecksum = 2,  // data frames and EAGER: `crc` is the CRC32C of the payload's bytes
  kFlagVector = 4,    // kWriteData: a vectored write's chunk (each names its own key; docs/wire.md);
                      // kReadReq: one segment of a vectored read
  kFlagMore = 8,      // kReadReq with kFlagVector: more segments of the read follow
  kFlagTable = 16,    // kWriteData with kFlagVector: a0 pieces, their table, then the path's list
                      // descriptor (docs/wire.md "Tables"; inline, path 0: then the pieces' bytes
                      // in the table's order); kReadData: the same with a2 pieces; kReadReq with
                      // kFlagVector: a0 segments' (key, offset, length) entries and nothing else
};
// kCts a1 (receiver) and kReadReq a3 (reader): bit k set = path k may carry chunks into the buffer
// being filled. Only paths that reach some destinations and not others (devmem) are named; the
// rest reach any buffer.
inline constexpr uint32_t kMaxPathDescriptor = 256;
// A table chunk: at most kMaxTableEntries pieces, each (key u64, offset u64, length u32), then
// the path's list descriptor (at most kMaxTableDescriptor bytes).
inline constexpr uint32_t kMaxTableEntries = 1024;
inline constexpr uint32_t kTableEntrySize = 20;
inline constexpr uint32_t kMaxTableDescriptor = 8704;
inline constexpr uint32_t kMaxTablePayload = kMaxTableEntries * kTableEntrySize + kMaxTableDescriptor;
// A table's pieces are at most kMaxTablePiece bytes each and kMaxTableBytes together; the target
// refuses more (the decoder cannot see them: they are in the payload).
inline constexpr uint64_t kMaxTablePiece = 1 << 20;
inline constexpr uint64_t kMaxTableBytes = 32 << 20;
inline constexpr uint8_t kMaxPathId = 16;

// Operation kinds named in kAck / kCancel.
enum class OpKind : uint8_t { kSend = 1, kWrite = 2, kRead = 3 };

struct FrameHeader {
  FrameType type = FrameType::kKeepalive;
  uint8_t flags = 0;
  uint32_t payload_len = 0;
  uint64_t id = 0;
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  uint8_t path = 0;  // 0: inline; k: the k-th agreed transport
  uint32_t crc = 0;  // with kFlagChecksum
};

// One entry of a table (WRITE_DATA, READ_DATA and READ_REQ tables; docs/wire.md "Tables"): a
// write's remote key and offset, a read's key 0 and place in the read, a READ_REQ's segment.
struct TableEntry {
  uint64_t key, offset;
  uint32_t length;
};
inline void put_table_entry(unsigned char* p, const TableEntry& e) {
  put_u64(p, e.key);
  put_u64(p + 8, e.offset);
  put_u32(p + 16, e.length);
}
inline TableEntry get_table_entry(const unsigned char* p) { return {get_u64(p), get_u64(p + 8), get_u32(p + 16)}; }

// The pieces a TABLE frame announces: a0 for WRITE_DATA (a0 and a1 name no region then), a2 for
// READ_DATA (whose a0 and a1 keep their meaning: the first piece's offset, the read's length).
inline uint64_t table_pieces(const FrameHeader& h) { return h.type == FrameType::kReadData ? h.a2 : h.a0; }

// The bytes of an inline table's entries (WRITE_DATA or READ_DATA, TABLE, path 0), which precede
// its data in the payload; 0 for any other frame.
inline uint64_t inline_table_bytes(const FrameHeader& h) {
  bool table = (h.type == FrameType::kWriteData || h.type == FrameType::kReadData) && (h.flags & kFlagTable);
  return table && h.path == 0 ? table_pieces(h) * kTableEntrySize : 0;
}

// The data frames: a chunk of a rendezvous message, a write or a read's reply.
inline bool is_chunk(FrameType t) {
  return t == FrameType::kSendData || t == FrameType::kWriteData || t == FrameType::kReadData;
}

// Frames whose bytes a checksum covers: the data frames and EAGER.
inline bool carries_data(FrameType t) { return is_chunk(t) || t == FrameType::kEager; }

using HeaderBytes = std::array<unsigned char, kHeaderSize>;

HeaderBytes encode_header(const FrameHeader& h);

// Limits a receiver enforces on every header before looking at the payload.
struct Limits {
  uint32_t max_chunk = 0;      // kSendData / kWriteData / kReadData payloads
  uint32_t max_eager = 0;      // kEager payloads
};

// Decodes and validates a header: magic, known type, reserved fields zero, flags known for the
// type, payload length within the limit for the type. Code::kProtocol with the reason otherwise.
Result<FrameHeader> decode_header(const unsigned char* bytes, const Limits& limits);

std::string_view frame_type_name(FrameType t);
std::string describe(const FrameHeader& h);  // for logs and errors

}  // namespace dmx::wire
