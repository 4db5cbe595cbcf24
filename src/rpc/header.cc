#include "rpc/header.h"

#include <cstring>
#include <string>

namespace dmx::rpc {
namespace {

// Layout (little-endian): magic u32 @0, version u16 @4, kind u8 @6, method u8 @7, slot u32 @8,
// payload_len u32 @12, status u32 @16, slots u32 @20, slot_size u32 @24, reserved @28..39 (zero),
// token u64 @40, region @48..63 (hello; zero otherwise).
template <typename T>
void put(unsigned char* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<unsigned char>(static_cast<uint64_t>(v) >> (8 * i));
}
template <typename T>
T get(const unsigned char* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return static_cast<T>(v);
}

bool zero(const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

Status bad(const std::string& what) { return Status(Code::kProtocol, "rpc control header: " + what); }

}  // namespace

Wire encode_header(const Header& h) {
  Wire w{};
  put<uint32_t>(&w[0], kMagic);
  put<uint16_t>(&w[4], kVersion);
  w[6] = static_cast<unsigned char>(h.kind);
  w[7] = static_cast<unsigned char>(h.method);
  put<uint32_t>(&w[8], h.slot);
  put<uint32_t>(&w[12], h.payload_len);
  put<uint32_t>(&w[16], h.status);
  put<uint32_t>(&w[20], h.slots);
  put<uint32_t>(&w[24], h.slot_size);
  put<uint64_t>(&w[40], h.token);
  if (h.kind == Kind::kHello) std::memcpy(&w[48], h.region.data(), h.region.size());
  return w;
}

Result<Header> parse_header(const unsigned char* data, size_t len) {
  if (len != kHeaderSize) return bad(std::to_string(len) + " bytes, expected " + std::to_string(kHeaderSize));
  if (get<uint32_t>(data) != kMagic) return bad("bad magic");
  if (get<uint16_t>(data + 4) != kVersion) return bad("version " + std::to_string(get<uint16_t>(data + 4)));
  Header h;
  uint8_t kind = data[6], method = data[7];
  if (kind < 1 || kind > 4) return bad("unknown kind " + std::to_string(kind));
  h.kind = static_cast<Kind>(kind);
  if (!zero(data + 28, 12) || (h.kind != Kind::kHello && !zero(data + 48, 16)))
    return bad("reserved bytes not zero");
  if (h.kind == Kind::kHello) std::memcpy(h.region.data(), data + 48, h.region.size());
  if (h.kind == Kind::kRequest && method != 1 && method != 2) return bad("unknown method " + std::to_string(method));
  h.method = static_cast<Method>(method);
  h.slot = get<uint32_t>(data + 8);
  h.payload_len = get<uint32_t>(data + 12);
  h.status = get<uint32_t>(data + 16);
  h.slots = get<uint32_t>(data + 20);
  h.slot_size = get<uint32_t>(data + 24);
  h.token = get<uint64_t>(data + 40);
  return h;
}

}  // namespace dmx::rpc
