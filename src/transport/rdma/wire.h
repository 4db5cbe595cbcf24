// What the rdma transport puts on the wire, verbs-free so that every build (and the fuzzer) has it:
// the offer descriptor (HELLO), the connection info both sides exchange on the engine's
// authenticated data socket (queue-pair numbers, PSNs, GID, credits), the chunk descriptor a chunk
// header carries and the receiver's clear-to-send. All of it comes from the peer:
// each decoder validates every field with overflow-safe arithmetic and says what was wrong.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dmx/status.h"

namespace dmx::rdma {

inline constexpr uint8_t kOfferVersion = 1;
inline constexpr uint8_t kConnVersion = 2;  // 2: WRITE with immediate, small chunks by SEND
inline constexpr uint32_t kConnMagic = 0x52584d44;  // "DMXR"
inline constexpr int kMaxQps = 16;
inline constexpr size_t kMaxDeviceName = 64;
inline constexpr uint64_t kMinChunk = 4096;
inline constexpr uint64_t kMaxChunk = uint64_t{1} << 30;
inline constexpr uint32_t kMaxQpn = 0xFFFFFF;  // 24 bits
inline constexpr uint32_t kMaxPsn = 0xFFFFFF;
inline constexpr uint32_t kMaxToken = 0xFFFFFF;  // a chunk's token rides in 24 bits of immediate data
inline constexpr uint64_t kSmallMax = 2048;      // a chunk up to this size goes by SEND (receive slots)
inline constexpr int kMaxCredits = 64;           // small chunks in flight per queue pair, at most

using Gid = std::array<unsigned char, 16>;

// What one side offers: the device, port, GID and MTU it would use and what memory it registers.
struct Offer {
  bool forced = false;    // transport=rdma on this side
  bool ethernet = false;  // RoCE (else InfiniBand)
  bool gpu_dmabuf = false, gpu_peermem = false;
  uint8_t mtu = 0;   // enum ibv_mtu: 1 = 256 ... 5 = 4096
  uint8_t port = 0;
  Gid gid{};
  std::string device;

  std::vector<unsigned char> encode() const;
  // Untrusted: kUnavailable naming what is wrong.
  static Result<Offer> decode(std::span<const unsigned char> b);
};

// One side's queue pairs, as sent on the data socket.
struct ConnInfo {
  uint8_t mtu = 0;
  uint16_t lid = 0;
  Gid gid{};
  uint64_t max_chunk = 0;
  uint8_t credits = 1;  // small chunks the peer may have in flight per queue pair (this side's slots)
  struct Qp {
    uint32_t qpn = 0, psn = 0;
  };
  std::vector<Qp> qps;

  static constexpr size_t kFixed = 4 + 4 + 2 + 16 + 8;  // magic, version/n/mtu/pad, lid, gid, max_chunk
  static constexpr size_t kPerQp = 8;
  std::vector<unsigned char> encode() const;
  // The size of the whole message from its fixed part (kFixed bytes), or kProtocol.
  static Result<size_t> total_size(std::span<const unsigned char> fixed);
  // Untrusted: kProtocol naming `peer` and the field.
  static Result<ConnInfo> decode(std::span<const unsigned char> b, const std::string& peer);
};

// The messages on the queue pairs: a SEND's immediate data is kind << 24 | a 24-bit value (a token,
// or credits given back); an RDMA WRITE's immediate data is the bare token of its chunk.
enum QpMessage : uint32_t {
  kMsgCts = 1,     // path, receiver -> sender: a Cts (16 B) for the token: write the chunk there
  kMsgSmall = 2,   // path, sender -> receiver: a small chunk's bytes
  kMsgDone = 3,    // path, receiver -> sender: the small chunk left its slot (its credit comes back)
  kMsgData = 4,    // control stream: its bytes (1..kSmallMax); the value: credits given back
  kMsgCredit = 5,  // control stream: no bytes; the value: credits given back
  kMsgEnd = 6,     // control stream: no bytes; the sender is done, after every byte it sent
};

// A chunk header's payload: its length and token, and whether its bytes come by SEND into a
// receive slot (small) or by RDMA WRITE with immediate data after the receiver's clear-to-send.
struct ChunkDescriptor {
  uint64_t len = 0;
  uint32_t token = 0;  // 24 bits
  bool small = false;

  static constexpr size_t kSize = 16;
  std::vector<unsigned char> encode() const;
  // Untrusted: kProtocol naming `peer` when the size or flags are wrong, len > max (kSmallMax for
  // a small chunk) or the token is over 24 bits.
  static Result<ChunkDescriptor> decode(std::span<const unsigned char> b, uint64_t max, const std::string& peer);
};

// The receiver's clear-to-send for one chunk (a SEND's payload, the token in its immediate data):
// where to write it and the rkey of exactly that window; or `drop`, the chunk is not wanted.
struct Cts {
  uint64_t addr = 0;
  uint32_t rkey = 0;
  bool drop = false;

  static constexpr size_t kSize = 16;
  std::vector<unsigned char> encode() const;
  // Untrusted: kProtocol naming `peer` when malformed or addr + len wraps.
  static Result<Cts> decode(std::span<const unsigned char> b, uint64_t len, const std::string& peer);
};

// For tests: a sender that writes other than the clear-to-send says (hostile-peer cases).
struct WriteTamper {
  int64_t addr_delta = 0;             // added to the remote address
  uint32_t rkey_xor = 0;              // flips bits of the rkey
  bool ignore_credits = false;        // sends small chunks whatever credits it has (a flood)
  const std::atomic<bool>* hold = nullptr;  // while true, WRITEs wait (a write kept in flight)
};

// "fe80::…" style text of a GID, for reasons and logs.
std::string gid_text(const Gid& g);

}  // namespace dmx::rdma
