// Fuzzes the handshake payloads a listener decodes before any authentication: wire::decode_hello
// wire::decode_join and wire::decode_rejoin. Whatever decodes must re-encode to exactly the input bytes (the format
// has one encoding per value; a decoder that accepts two spellings of one HELLO would let a peer
// smuggle bytes past the proof, which covers the encoding) and satisfy the documented bounds.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "wire/frame.h"
#include "wire/handshake.h"

using namespace dmx::wire;

namespace {

bool printable(const std::string& s) {
  for (unsigned char c : s)
    if (c < 0x20 || c > 0x7e) return false;
  return true;
}

void check_round_trip(const std::vector<unsigned char>& again, const uint8_t* data, size_t size) {
  if (again.size() != size || std::memcmp(again.data(), data, size) != 0) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto h = decode_hello(data, size);
  if (h.ok()) {
    if (h->version != kProtocolVersion || h->streams < 1 || h->streams > kMaxStreams) std::abort();
    if (h->chunk_size < kMinChunk || h->chunk_size > kMaxChunk || h->eager_limit > kMaxChunk) std::abort();
    if (h->unexpected_budget > kMaxUnexpectedBudget || h->offers.size() > kMaxOffers) std::abort();
    for (const auto& o : h->offers)
      if (o.name.empty() || o.name.size() > kMaxOfferName || o.descriptor.size() > kMaxOfferDescriptor) std::abort();
    if (!printable(h->boot_id) || !printable(h->hostname) || !printable(h->local_channel)) std::abort();
    if (h->boot_id.size() > 64 || h->hostname.size() > 255 || h->local_channel.size() > 108) std::abort();
    check_round_trip(encode_hello(*h), data, size);
  } else if (h.status().code() != dmx::Code::kProtocol) {
    std::abort();
  }
  auto j = decode_join(data, size);
  if (j.ok()) {
    if (j->streams < 1 || j->streams > stream_sockets(kMaxStreams) || j->index < 1 || j->index >= j->streams + kMaxOffers) std::abort();
    check_round_trip(encode_join(*j), data, size);
  } else if (j.status().code() != dmx::Code::kProtocol) {
    std::abort();
  }
  auto r = decode_rejoin(data, size);
  if (r.ok()) {
    if (r->session == 0 || r->first < 1 || r->index < r->first) std::abort();
    check_round_trip(encode_rejoin(*r), data, size);
  } else if (r.status().code() != dmx::Code::kProtocol) {
    std::abort();
  }
  return 0;
}
