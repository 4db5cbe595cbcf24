#include "wire/handshake.h"

#include <arpa/inet.h>

#include <fmt/format.h>

#include <cstring>

#include "wire/frame.h"
#include "wire/le.h"

namespace dmx::wire {
namespace {

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(v); }
  // Encoded into a local buffer and appended: resize() then writing through data() made g++ 12 at
  // -O3 warn of a memset past the end (-Wstringop-overflow, a false positive).
  void u16(uint16_t v) { put(v, put_u16); }
  void u32(uint32_t v) { put(v, put_u32); }
  void u64(uint64_t v) { put(v, put_u64); }
  void bytes(const unsigned char* p, size_t n) { out_.insert(out_.end(), p, p + n); }
  void str(const std::string& s) {
    u16(static_cast<uint16_t>(s.size()));
    bytes(reinterpret_cast<const unsigned char*>(s.data()), s.size());
  }
  std::vector<unsigned char> take() { return std::move(out_); }

 private:
  template <typename T, typename Put>
  void put(T v, Put encode) {
    unsigned char b[sizeof(T)];
    encode(b, v);
    bytes(b, sizeof b);
  }
  std::vector<unsigned char> out_;
};

// Reads fields in order; the first short read poisons the reader and is reported once.
class Reader {
 public:
  Reader(const unsigned char* p, size_t n) : p_(p), n_(n) {}
  bool take(size_t k) {
    if (!ok_ || n_ - off_ < k) return ok_ = false;
    return true;
  }
  uint8_t u8() { return take(1) ? p_[off_++] : 0; }
  uint16_t u16() { return take(2) ? (off_ += 2, get_u16(p_ + off_ - 2)) : 0; }
  uint32_t u32() { return take(4) ? (off_ += 4, get_u32(p_ + off_ - 4)) : 0; }
  uint64_t u64() { return take(8) ? (off_ += 8, get_u64(p_ + off_ - 8)) : 0; }
  void bytes(unsigned char* out, size_t k) {
    if (k > 0 && take(k)) std::memcpy(out, p_ + off_, k), off_ += k;  // an empty vector's data() may be null
  }
  std::string str(size_t max) {
    uint16_t len = u16();
    if (len > max) {
      too_long_ = true;
      ok_ = false;
    }
    if (!take(len)) return {};
    std::string s(reinterpret_cast<const char*>(p_ + off_), len);
    off_ += len;
    return s;
  }
  Status finish(std::string_view what) const {
    if (too_long_) return Status(Code::kProtocol, fmt::format("{}: a string field is too long", what));
    if (!ok_) return Status(Code::kProtocol, fmt::format("{}: truncated ({} bytes)", what, n_));
    if (off_ != n_) return Status(Code::kProtocol, fmt::format("{}: {} unexpected trailing bytes", what, n_ - off_));
    return Status();
  }

 private:
  const unsigned char* p_;
  size_t n_;
  size_t off_ = 0;
  bool ok_ = true;
  bool too_long_ = false;
};

bool printable(const std::string& s) {
  for (unsigned char c : s)
    if (c < 0x20 || c > 0x7e) return false;
  return true;
}

}  // namespace

const Offer* Hello::offer(std::string_view name) const {
  for (const Offer& o : offers)
    if (o.name == name) return &o;
  return nullptr;
}

std::vector<unsigned char> encode_hello(const Hello& h) {
  Writer w;
  w.u16(h.version);
  w.u8(static_cast<uint8_t>(h.role));
  w.u8(static_cast<uint8_t>(h.auth));
  w.u16(h.streams);
  w.u32(h.chunk_size);
  w.u32(h.eager_limit);
  w.u64(h.unexpected_budget);
  w.u64(h.session);
  w.bytes(h.nonce.data(), h.nonce.size());
  w.bytes(h.proof.data(), h.proof.size());
  w.str(h.boot_id);
  w.str(h.hostname);
  w.u32(h.pid);
  w.u32(h.peer_timeout_ms);
  w.str(h.local_channel);
  w.u8(static_cast<uint8_t>(h.offers.size()));
  for (const Offer& o : h.offers) {
    w.str(o.name);
    w.u16(static_cast<uint16_t>(o.descriptor.size()));
    w.bytes(o.descriptor.data(), o.descriptor.size());
  }
  w.u8(h.checksum);
  w.u8(static_cast<uint8_t>(h.addresses.size()));
  for (const std::string& a : h.addresses) w.str(a);
  w.u8(h.multilink);
  w.str(h.name);
  w.u64(h.epoch);
  return w.take();
}

Result<Hello> decode_hello(const unsigned char* data, size_t len) {
  Reader r(data, len);
  Hello h;
  h.version = r.u16();
  // Version first: another version may lay out the rest differently, and saying so is the useful
  // error.
  if (len >= 2 && h.version != kProtocolVersion)
    return Status(Code::kProtocol, fmt::format("peer speaks dmx protocol {}, this side speaks {}", h.version,
                                               kProtocolVersion));
  uint8_t role = r.u8();
  uint8_t auth = r.u8();
  h.streams = r.u16();
  h.chunk_size = r.u32();
  h.eager_limit = r.u32();
  h.unexpected_budget = r.u64();
  h.session = r.u64();
  r.bytes(h.nonce.data(), h.nonce.size());
  r.bytes(h.proof.data(), h.proof.size());
  h.boot_id = r.str(64);
  h.hostname = r.str(255);
  h.pid = r.u32();
  h.peer_timeout_ms = r.u32();
  h.local_channel = r.str(108);  // sun_path
  uint8_t offers = r.u8();
  if (offers > kMaxOffers) return Status(Code::kProtocol, fmt::format("HELLO: {} transports offered (at most {})", offers, kMaxOffers));
  for (uint8_t i = 0; i < offers; ++i) {
    Offer o;
    o.name = r.str(kMaxOfferName);
    uint16_t n = r.u16();
    if (n > kMaxOfferDescriptor)
      return Status(Code::kProtocol, fmt::format("HELLO: a transport descriptor of {} bytes (at most {})", n,
                                                 kMaxOfferDescriptor));
    o.descriptor.resize(r.take(n) ? n : 0);
    r.bytes(o.descriptor.data(), o.descriptor.size());
    h.offers.push_back(std::move(o));
  }
  h.checksum = r.u8();
  uint8_t addresses = r.u8();
  if (addresses > kMaxAddresses)
    return Status(Code::kProtocol, fmt::format("HELLO: {} addresses (at most {})", addresses, kMaxAddresses));
  for (uint8_t i = 0; i < addresses; ++i) h.addresses.push_back(r.str(INET6_ADDRSTRLEN));
  h.multilink = r.u8();
  h.name = r.str(kMaxHelloName);
  h.epoch = r.u64();
  DMX_RETURN_IF_ERROR(r.finish("HELLO"));
  if (!printable(h.name)) return Status(Code::kProtocol, "HELLO: the store name has non-printable characters");
  if (h.multilink > static_cast<uint8_t>(Multilink::kOn))
    return Status(Code::kProtocol, fmt::format("HELLO: unknown multilink mode {}", h.multilink));
  for (const std::string& a : h.addresses) {
    unsigned char buf[16];
    if (::inet_pton(AF_INET, a.c_str(), buf) != 1 && ::inet_pton(AF_INET6, a.c_str(), buf) != 1)
      return Status(Code::kProtocol, "HELLO: an address is not an IPv4 or IPv6 literal");
  }
  if (h.checksum > static_cast<uint8_t>(Checksum::kCrc32c))
    return Status(Code::kProtocol, fmt::format("HELLO: unknown checksum {}", h.checksum));
  for (size_t i = 0; i < h.offers.size(); ++i) {
    const std::string& name = h.offers[i].name;
    bool ok = !name.empty();
    for (char c : name) ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_');
    if (!ok) return Status(Code::kProtocol, "HELLO: a transport name is empty or not of [a-z0-9_]");
    for (size_t k = 0; k < i; ++k)
      if (h.offers[k].name == name) return Status(Code::kProtocol, fmt::format("HELLO: transport {} offered twice", name));
  }
  if (role != static_cast<uint8_t>(Role::kClient) && role != static_cast<uint8_t>(Role::kServer))
    return Status(Code::kProtocol, fmt::format("HELLO: unknown role {}", role));
  h.role = static_cast<Role>(role);
  if (auth > static_cast<uint8_t>(AuthMode::kHmacSha256))
    return Status(Code::kProtocol, fmt::format("HELLO: unknown auth mode {}", auth));
  h.auth = static_cast<AuthMode>(auth);
  if (h.streams < 1 || h.streams > kMaxStreams)
    return Status(Code::kProtocol, fmt::format("HELLO: stream count {} outside 1-{}", h.streams, kMaxStreams));
  if (h.chunk_size < kMinChunk || h.chunk_size > kMaxChunk)
    return Status(Code::kProtocol, fmt::format("HELLO: chunk size {} outside {}-{}", h.chunk_size, kMinChunk, kMaxChunk));
  if (h.eager_limit > kMaxChunk) return Status(Code::kProtocol, fmt::format("HELLO: eager limit {} too large", h.eager_limit));
  if (h.unexpected_budget > kMaxUnexpectedBudget)
    return Status(Code::kProtocol, fmt::format("HELLO: unexpected budget {} too large", h.unexpected_budget));
  if (h.peer_timeout_ms < 100)
    return Status(Code::kProtocol, fmt::format("HELLO: peer timeout of {} ms is too short", h.peer_timeout_ms));
  if (!printable(h.boot_id) || !printable(h.hostname) || !printable(h.local_channel))
    return Status(Code::kProtocol, "HELLO: host identity has non-printable characters");
  return h;
}

bool multilink_agreed(const Hello& client, const Hello& server) {
  auto off = static_cast<uint8_t>(Multilink::kOff), on = static_cast<uint8_t>(Multilink::kOn);
  if (client.multilink == off || server.multilink == off) return false;
  return client.multilink == on || server.multilink == on || !server.addresses.empty();
}

std::vector<unsigned char> encode_join(const Join& j) {
  Writer w;
  w.u64(j.session);
  w.u16(j.index);
  w.u16(j.streams);
  w.bytes(j.proof.data(), j.proof.size());
  return w.take();
}

Result<Join> decode_join(const unsigned char* data, size_t len) {
  Reader r(data, len);
  Join j;
  j.session = r.u64();
  j.index = r.u16();
  j.streams = r.u16();
  r.bytes(j.proof.data(), j.proof.size());
  DMX_RETURN_IF_ERROR(r.finish("JOIN"));
  // index >= streams is a transport's data socket; whether the session agreed one is the
  // listener's check (it knows the session).
  if (j.streams < 1 || j.streams > stream_sockets(kMaxStreams) || j.index < 1 || j.index >= j.streams + kMaxOffers)
    return Status(Code::kProtocol, fmt::format("JOIN: stream {} of {} is not a valid extra stream or data socket",
                                               j.index, j.streams));
  return j;
}

std::vector<unsigned char> encode_rejoin(const Rejoin& r) {
  Writer w;
  w.u64(r.session);
  w.u64(r.client_epoch);
  w.u64(r.server_epoch);
  w.u16(r.first);
  w.u16(r.index);
  w.bytes(r.proof.data(), r.proof.size());
  return w.take();
}

Result<Rejoin> decode_rejoin(const unsigned char* data, size_t len) {
  Reader r(data, len);
  Rejoin j;
  j.session = r.u64();
  j.client_epoch = r.u64();
  j.server_epoch = r.u64();
  j.first = r.u16();
  j.index = r.u16();
  r.bytes(j.proof.data(), j.proof.size());
  DMX_RETURN_IF_ERROR(r.finish("REJOIN"));
  // Whether the index is the next of the endpoint's streams is the endpoint's check.
  if (j.session == 0 || j.first < 1 || j.index < j.first)
    return Status(Code::kProtocol, fmt::format("REJOIN: stream {} of a round from {} is not a valid rejoin", j.index,
                                               j.first));
  return j;
}

}  // namespace dmx::wire
