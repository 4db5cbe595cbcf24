// Handshake messages (payloads of HELLO and JOIN frames): what each side is and can do.
// Pure encode/decode with strict validation; see docs/wire.md for the exchange.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dmx/status.h"

namespace dmx::wire {

using Nonce = std::array<unsigned char, 32>;
using Proof = std::array<unsigned char, 32>;

enum class Role : uint8_t { kClient = 1, kServer = 2 };
enum class AuthMode : uint8_t { kInsecure = 0, kHmacSha256 = 1 };

// A transport a side offers (src/transport/transport.h): its name and its descriptor for the peer.
struct Offer {
  std::string name;  // 1 to kMaxOfferName of [a-z0-9_]
  std::vector<unsigned char> descriptor;
};
inline constexpr size_t kMaxOffers = 16;
inline constexpr size_t kMaxOfferName = 32;
inline constexpr size_t kMaxOfferDescriptor = 128;
inline constexpr size_t kMaxHelloName = 258;  // "<job>/<name>", each at most 128

inline constexpr uint16_t kMaxStreams = 64;  // data streams a HELLO may ask for
// The stream sockets of a session of `streams` data streams: beside more than one, a control
// stream (index 0) that carries no inline data.
constexpr uint16_t stream_sockets(uint16_t streams) { return streams > 1 ? streams + 1 : 1; }
inline constexpr uint32_t kMinChunk = 64 << 10;
inline constexpr uint32_t kMaxChunk = 64 << 20;
inline constexpr uint64_t kMaxUnexpectedBudget = uint64_t{1} << 40;  // 1 TiB: sums of it cannot wrap

// Per-chunk end-to-end checksums (docs/wire.md, "Checksums").
enum class Checksum : uint8_t { kNone = 0, kCrc32c = 1 };

struct Hello {
  uint16_t version = 0;
  Role role = Role::kClient;
  AuthMode auth = AuthMode::kHmacSha256;
  uint16_t streams = 1;          // client: requested; server: agreed
  uint32_t chunk_size = 0;       // client: proposed; server: agreed
  uint32_t eager_limit = 0;      // largest EAGER payload this side accepts
  uint64_t unexpected_budget = 0;  // EAGER bytes this side buffers before a matching recv
  uint64_t session = 0;          // server: the endpoint's session id; client: 0
  Nonce nonce{};
  Proof proof{};                 // server: proof of the key; client: zeros
  std::string boot_id;           // /proc/sys/kernel/random/boot_id (same host detection)
  std::string hostname;
  uint32_t pid = 0;
  uint32_t peer_timeout_ms = 0;  // this side declares the peer dead after this much silence
  // Client, same-host paths: the Unix socket where it waits for the server's side channels;
  // empty when it offers no transport that needs one.
  std::string local_channel;
  // The transports this side offers (the server: those it accepts for this client), in the
  // registry's order. The streams are always there; "tcp", listed like the others, is what
  // lets chunks ride them when no path carries them.
  std::vector<Offer> offers;
  const Offer* offer(std::string_view name) const;
  // What this side asks of every data chunk (Checksum); the endpoint uses the stronger of the two.
  uint8_t checksum = 0;
  // Several links (docs/architecture.md, "Several NICs"). Server: the addresses of its other NICs
  // that take streams on the listener's port (IPv4 or IPv6 literals); client: none.
  std::vector<std::string> addresses;
  // Chunk acknowledgement per data stream, so that a dead link's chunks move to the others
  // (Multilink): used when both ask for it and either forces it or the server lists an address.
  uint8_t multilink = 0;
  // Protocol 6: this side's name and epoch in the store (docs/cluster.md); "" and 0 without one.
  std::string name;  // "job/name", at most kMaxHelloName printable bytes
  uint64_t epoch = 0;
};
inline constexpr size_t kMaxAddresses = 16;
enum class Multilink : uint8_t { kOff = 0, kAuto = 1, kOn = 2 };
// The rule both sides apply to the two HELLOs (symmetric).
bool multilink_agreed(const Hello& client, const Hello& server);

struct Join {
  uint64_t session = 0;
  uint16_t index = 0;  // 1 .. streams-1: an extra stream; streams + k: the k-th data socket (docs/wire.md)
  uint16_t streams = 0;
  Proof proof{};
};

// A new stream of a live endpoint whose streams all died (reconnect_timeout; docs/reliability.md,
// "Reconnect"): the client's index for it (the next one both sides use: the original streams,
// then every rejoined one in order) and the first of its round (streams below it are replaced),
// the session and both epochs (0: no store), and a proof bound to the session's nonces, the
// round and the index.
struct Rejoin {
  uint64_t session = 0;
  uint64_t client_epoch = 0, server_epoch = 0;
  uint16_t first = 0, index = 0;  // 1 <= first <= index
  Proof proof{};
};

std::vector<unsigned char> encode_hello(const Hello& h);
Result<Hello> decode_hello(const unsigned char* data, size_t len);
std::vector<unsigned char> encode_join(const Join& j);
Result<Join> decode_join(const unsigned char* data, size_t len);
std::vector<unsigned char> encode_rejoin(const Rejoin& r);
Result<Rejoin> decode_rejoin(const unsigned char* data, size_t len);

}  // namespace dmx::wire
