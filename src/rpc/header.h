// rpc/header.h — the 64-byte SplitRPC control header and the tags that carry an RPC over dmx.
//
// A request is the control header (a send, to the CPU handler, host memory) and the payload (a
// one-sided write with a notification, straight into the client's slot of the server's receive
// pool); the response is a send from the pool tagged with the slot, or an error header. Every
// header from a peer is hostile until parse_header() accepted it. Pure code, no I/O; thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "dmx/status.h"

namespace dmx::rpc {

inline constexpr size_t kHeaderSize = 64;  // as SplitRPC's p2p_rpc_hdr
inline constexpr uint32_t kMagic = 0x43505244;  // "DRPC" little-endian
inline constexpr uint16_t kVersion = 1;

// Tags: a fixed prefix in the high bits, the client-local slot in the low 32 (response).
inline constexpr uint64_t kTagCtrl = 0x5250'4300'0000'0000ULL;  // control headers, both ways
inline constexpr uint64_t kTagResp = 0x5250'5200'0000'0000ULL;  // response payload | slot
inline constexpr uint64_t kTagMask = 0xffff'ffff'0000'0000ULL;
inline uint64_t resp_tag(uint32_t slot) { return kTagResp | slot; }
// Distance between slots in a partition (both sides compute it from the hello's slot size).
inline uint64_t slot_stride(uint32_t slot_size) { return (static_cast<uint64_t>(slot_size) + 255) & ~uint64_t{255}; }

enum class Kind : uint8_t {
  kHello = 1,     // server -> client on accept: slots and slot size
  kRequest = 2,   // client -> server: method, slot, payload length
  kResponse = 3,  // server -> client, only for errors (a success is the response payload itself)
  kRefused = 4,   // server -> client before it closes the connection
};

enum class Method : uint8_t { kVecop = 1, kMlp = 2 };

struct Header {
  Kind kind = Kind::kRequest;
  Method method = Method::kVecop;
  uint32_t slot = 0;         // client-local slot index
  uint32_t payload_len = 0;  // request: bytes of the payload message that follows
  uint32_t status = 0;       // response/refused: a dmx::Code
  uint64_t token = 0;        // client-chosen id, echoed
  uint32_t slots = 0;        // hello: slots this client may use
  uint32_t slot_size = 0;    // hello: bytes per slot (request and response each)
  std::array<unsigned char, 16> region{};  // hello: the partition's RemoteRegion, serialized
};

using Wire = std::array<unsigned char, kHeaderSize>;

Wire encode_header(const Header& h);
// Accepts exactly kHeaderSize bytes with the right magic and version, a known kind and method,
// and reserved bytes zero (bytes 48-63 carry the region in a hello); anything else is kProtocol.
Result<Header> parse_header(const unsigned char* data, size_t len);

}  // namespace dmx::rpc
