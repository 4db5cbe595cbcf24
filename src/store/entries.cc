#include "store/entries.h"

#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <nlohmann/json.hpp>

namespace dmx::store {
namespace {

using nlohmann::json;

std::string hmac_hex(const Secret& s, const std::string& text) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), s.key.data(), static_cast<int>(s.key.size()), reinterpret_cast<const unsigned char*>(text.data()),
       text.size(), mac, &len);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) hex += fmt::format("{:02x}", mac[i]);
  return hex;
}

bool equal_ct(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

std::string sign(json j, const Secret& s) {
  if (!s.insecure) j["sig"] = hmac_hex(s, j.dump());
  return j.dump();
}

// Parses and checks the signature; the object without "sig".
Result<json> verified(const std::string& key, std::string_view value, const Secret& s, const char* kind) {
  if (value.size() > 64 * 1024)
    return Status(Code::kProtocol, fmt::format("store entry {}: {} bytes, more than an entry holds", key, value.size()));
  json j = json::parse(value, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Status(Code::kProtocol, fmt::format("store entry {}: not a JSON object", key));
  if (j.value("kind", "") != kind)
    return Status(Code::kProtocol, fmt::format("store entry {}: not a {} entry", key, kind));
  if (s.insecure) {
    j.erase("sig");
    return j;
  }
  auto it = j.find("sig");
  if (it == j.end() || !it->is_string())
    return Status(Code::kAuth, fmt::format("store entry {}: refused: it is not signed (forged, or written by a "
                                           "process running insecure)", key));
  std::string sig = it->get<std::string>();
  j.erase("sig");
  if (!equal_ct(sig, hmac_hex(s, j.dump())))
    return Status(Code::kAuth, fmt::format("store entry {}: refused: its signature does not match this job's auth key "
                                           "(forged or altered, or signed with another key)", key));
  return j;
}

template <typename T>
Status field(const json& j, const char* name, T* out, const std::string& key) {
  try {
    *out = j.at(name).get<T>();
    return {};
  } catch (...) {
    return Status(Code::kProtocol, fmt::format("store entry {}: field {} is missing or malformed", key, name));
  }
}

Status check_under(const std::string& key, const std::string& expected) {
  if (key == expected) return {};
  return Status(Code::kAuth, fmt::format("store entry {}: refused: it is signed for {} (copied under another name)",
                                         key, expected));
}

}  // namespace

Status check_name(std::string_view what, std::string_view name) {
  bool ok = !name.empty() && name.size() <= 128 && name != "." && name != "..";
  for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
  if (ok) return {};
  return Status(Code::kInvalidArgument, fmt::format("{} '{}': want 1-128 of [A-Za-z0-9._-]", what, name));
}

std::string peer_key(std::string_view job, std::string_view name) { return fmt::format("dmx/{}/peers/{}", job, name); }
std::string region_key(std::string_view job, std::string_view name) {
  return fmt::format("dmx/{}/regions/{}", job, name);
}
std::string pool_key(std::string_view job, std::string_view host, std::string_view name) {
  return fmt::format("dmx/{}/pools/{}@{}", job, name, host);
}
std::string epoch_key(std::string_view job, std::string_view name) { return fmt::format("dmx/{}/epoch/{}", job, name); }
std::string peers_prefix(std::string_view job) { return fmt::format("dmx/{}/peers/", job); }
std::string regions_prefix(std::string_view job) { return fmt::format("dmx/{}/regions/", job); }
std::string pools_prefix(std::string_view job) { return fmt::format("dmx/{}/pools/", job); }

std::string encode(const PeerEntry& e, const Secret& s) {
  return sign(json{{"kind", "peer"},
                   {"job", e.job},
                   {"name", e.name},
                   {"epoch", e.epoch},
                   {"addresses", e.addresses},
                   {"transports", e.transports},
                   {"host", e.host},
                   {"pid", e.pid}},
              s);
}

std::string encode(const RegionEntry& e, const Secret& s) {
  return sign(json{{"kind", "region"},
                   {"job", e.job},
                   {"name", e.name},
                   {"owner", e.owner},
                   {"owner_epoch", e.owner_epoch},
                   {"key", fmt::format("{:016x}", e.key)},
                   {"size", e.size},
                   {"memory", e.memory},
                   {"device", e.device},
                   {"host", e.host}},
              s);
}

std::string encode(const PoolEntry& e, const Secret& s) {
  return sign(json{{"kind", "pool"},
                   {"job", e.job},
                   {"host", e.host},
                   {"name", e.name},
                   {"pool_kind", e.kind},
                   {"device", e.device},
                   {"numa", e.numa},
                   {"bytes", e.bytes}},
              s);
}

Result<PeerEntry> decode_peer(const std::string& key, std::string_view value, const Secret& s) {
  DMX_ASSIGN_OR_RETURN(json j, verified(key, value, s, "peer"));
  PeerEntry e;
  DMX_RETURN_IF_ERROR(field(j, "job", &e.job, key));
  DMX_RETURN_IF_ERROR(field(j, "name", &e.name, key));
  DMX_RETURN_IF_ERROR(field(j, "epoch", &e.epoch, key));
  DMX_RETURN_IF_ERROR(field(j, "addresses", &e.addresses, key));
  DMX_RETURN_IF_ERROR(field(j, "transports", &e.transports, key));
  DMX_RETURN_IF_ERROR(field(j, "host", &e.host, key));
  DMX_RETURN_IF_ERROR(field(j, "pid", &e.pid, key));
  DMX_RETURN_IF_ERROR(check_under(key, peer_key(e.job, e.name)));
  if (e.epoch == 0 || e.addresses.empty() || e.addresses.size() > 16)
    return Status(Code::kProtocol, fmt::format("store entry {}: no epoch or 1-16 addresses", key));
  return e;
}

Result<RegionEntry> decode_region(const std::string& key, std::string_view value, const Secret& s) {
  DMX_ASSIGN_OR_RETURN(json j, verified(key, value, s, "region"));
  RegionEntry e;
  std::string hex;
  DMX_RETURN_IF_ERROR(field(j, "job", &e.job, key));
  DMX_RETURN_IF_ERROR(field(j, "name", &e.name, key));
  DMX_RETURN_IF_ERROR(field(j, "owner", &e.owner, key));
  DMX_RETURN_IF_ERROR(field(j, "owner_epoch", &e.owner_epoch, key));
  DMX_RETURN_IF_ERROR(field(j, "key", &hex, key));
  DMX_RETURN_IF_ERROR(field(j, "size", &e.size, key));
  DMX_RETURN_IF_ERROR(field(j, "memory", &e.memory, key));
  DMX_RETURN_IF_ERROR(field(j, "device", &e.device, key));
  DMX_RETURN_IF_ERROR(field(j, "host", &e.host, key));
  try {
    size_t used = 0;
    e.key = std::stoull(hex, &used, 16);
    if (used != hex.size()) throw 0;
  } catch (...) {
    return Status(Code::kProtocol, fmt::format("store entry {}: a malformed region key", key));
  }
  DMX_RETURN_IF_ERROR(check_under(key, region_key(e.job, e.name)));
  return e;
}

Result<PoolEntry> decode_pool(const std::string& key, std::string_view value, const Secret& s) {
  DMX_ASSIGN_OR_RETURN(json j, verified(key, value, s, "pool"));
  PoolEntry e;
  DMX_RETURN_IF_ERROR(field(j, "job", &e.job, key));
  DMX_RETURN_IF_ERROR(field(j, "host", &e.host, key));
  DMX_RETURN_IF_ERROR(field(j, "name", &e.name, key));
  DMX_RETURN_IF_ERROR(field(j, "pool_kind", &e.kind, key));
  DMX_RETURN_IF_ERROR(field(j, "device", &e.device, key));
  DMX_RETURN_IF_ERROR(field(j, "numa", &e.numa, key));
  DMX_RETURN_IF_ERROR(field(j, "bytes", &e.bytes, key));
  DMX_RETURN_IF_ERROR(check_under(key, pool_key(e.job, e.host, e.name)));
  return e;
}

}  // namespace dmx::store
