// What the rdma transport puts on the wire, verbs-free so that every build (and the fuzzer) has it:
// the offer descriptor (HELLO), the connection info both sides exchange on the engine's
// authenticated data socket (queue-pair numbers, PSNs, GID), and the chunk descriptor a chunk
// header carries (where the receiver RDMA-READs the chunk from). All of it comes from the peer:
// each decoder validates every field with overflow-safe arithmetic and says what was wrong.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dmx/status.h"

namespace dmx::rdma {

inline constexpr uint8_t kOfferVersion = 1;
inline constexpr uint8_t kConnVersion = 1;
inline constexpr uint32_t kConnMagic = 0x52584d44;  // "DMXR"
inline constexpr int kMaxQps = 16;
inline constexpr size_t kMaxDeviceName = 64;
inline constexpr uint64_t kMinChunk = 4096;
inline constexpr uint64_t kMaxChunk = uint64_t{1} << 30;
inline constexpr uint32_t kMaxQpn = 0xFFFFFF;  // 24 bits
inline constexpr uint32_t kMaxPsn = 0xFFFFFF;

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

// A chunk header's payload: the sender's registered source, and the token the receiver returns
// (as immediate data) once it has read it.
struct ChunkDescriptor {
  uint64_t addr = 0;
  uint64_t len = 0;
  uint32_t rkey = 0;
  uint32_t token = 0;

  static constexpr size_t kSize = 24;
  std::vector<unsigned char> encode() const;
  // Untrusted: kProtocol naming `peer` when the size is wrong, len > max or addr + len wraps.
  static Result<ChunkDescriptor> decode(std::span<const unsigned char> b, uint64_t max, const std::string& peer);
};

// For tests: a receiver that reads other than what the descriptor names (hostile-peer cases).
struct RxTamper {
  int64_t addr_delta = 0;  // added to the remote address
  uint32_t rkey_xor = 0;   // flips bits of the rkey
};

// "fe80::…" style text of a GID, for reasons and logs.
std::string gid_text(const Gid& g);

}  // namespace dmx::rdma
