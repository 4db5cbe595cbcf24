#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <random>

#include "core/checked.h"
#include "memory/backend.h"
#include "tools/dmx/bench.h"

namespace dmx::bench {

using nlohmann::json;

namespace {

// A count from the peer: a JSON integer in [0, max]. nlohmann's get<uint64_t>() converts any number:
// a float out of range is undefined behaviour and a negative or oversized integer silently wraps
// (found by tests/fuzz/fuzz_bench_plan). Throws like json::at(), for the callers' one catch.
uint64_t count_field(const json& j, const char* key, uint64_t max = UINT64_MAX) {
  const json& v = j.at(key);
  if (!v.is_number_unsigned() || v.get<uint64_t>() > max)
    throw std::out_of_range(std::string("'") + key + "' is not an integer in [0, " + std::to_string(max) + "]");
  return v.get<uint64_t>();
}
uint64_t optional_count(const json& j, const char* key) { return j.contains(key) ? count_field(j, key) : 0; }

}  // namespace

std::string to_json(const Plan& p) {
  return json{{"op", p.op},         {"size", p.size},         {"iters", p.iters},   {"window", p.window},
              {"lat_iters", p.lat_iters}, {"warmup", p.warmup}, {"peer_mem", p.peer_mem}, {"verify", p.verify}, {"checksum", p.checksum}, {"crc", p.crc},
              {"quit", p.quit}, {"blocks", p.blocks}}
      .dump();
}

Result<Plan> plan_from_json(const std::string& s) {
  auto j = json::parse(s, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status(Code::kProtocol, "bench plan is not a JSON object");
  Plan p;
  try {
    p.op = j.at("op").get<std::string>();
    p.size = count_field(j, "size");
    p.iters = static_cast<uint32_t>(count_field(j, "iters", UINT32_MAX));
    p.window = static_cast<uint32_t>(count_field(j, "window", UINT32_MAX));
    p.lat_iters = static_cast<uint32_t>(count_field(j, "lat_iters", UINT32_MAX));
    p.warmup = static_cast<uint32_t>(count_field(j, "warmup", UINT32_MAX));
    if (p.warmup > 16) return Status(Code::kProtocol, "bench plan: more than 16 warm-up operations");
    p.peer_mem = j.at("peer_mem").get<std::string>();
    p.verify = j.at("verify").get<bool>();
    p.checksum = count_field(j, "checksum");
    p.crc = static_cast<uint32_t>(j.contains("crc") ? count_field(j, "crc", UINT32_MAX) : 0);  // only with checksums
    p.quit = j.at("quit").get<bool>();
    p.blocks = j.contains("blocks") ? count_field(j, "blocks") : 0;
  } catch (const std::exception& e) {
    return Status(Code::kProtocol, std::string("bench plan: ") + e.what());
  }
  if (p.op != "send" && p.op != "write" && p.op != "read") return Status(Code::kProtocol, "bench plan: unknown op");
  if (p.window == 0 || p.window > 64) return Status(Code::kProtocol, "bench plan: window must be 1-64");
  // The server allocates window x size: a peer's numbers, so checked before anything is sized.
  auto bytes = checked_mul(p.window, p.size);
  if (!bytes || *bytes > kMaxServerBuffer)
    return Status(Code::kProtocol, fmt::format("bench plan: {} x {} bytes exceeds the server's {}-byte buffer limit",
                                               p.window, p.size, kMaxServerBuffer));
  return p;
}

std::string to_json(const Reply& r) {
  return json{{"ok", r.ok},
              {"error", r.error},
              {"key", r.region.key},
              {"region_size", r.region.size},
              {"checksum", r.checksum},
              {"verified", r.verified},
              {"crc", r.crc},
              {"crc_ok", r.crc_ok},
              {"transport", r.transport},
              {"reason", r.reason},
              {"path_chunks_received", r.path_chunks_received},
              {"path_chunks_inline", r.path_chunks_inline}}
      .dump();
}

Result<Reply> reply_from_json(const std::string& s) {
  auto j = json::parse(s, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status(Code::kProtocol, "bench reply is not a JSON object");
  Reply r;
  try {
    r.ok = j.at("ok").get<bool>();
    r.error = j.at("error").get<std::string>();
    r.region.key = count_field(j, "key");
    r.region.size = count_field(j, "region_size");
    r.checksum = count_field(j, "checksum");
    r.verified = j.at("verified").get<bool>();
    r.crc = static_cast<uint32_t>(j.contains("crc") ? count_field(j, "crc", UINT32_MAX) : 0);
    r.crc_ok = j.contains("crc_ok") ? j.at("crc_ok").get<bool>() : true;  // no checksums: nothing to differ
    r.transport = j.at("transport").get<std::string>();
    r.reason = j.at("reason").get<std::string>();
    r.path_chunks_received = optional_count(j, "path_chunks_received");  // absent from older servers
    r.path_chunks_inline = optional_count(j, "path_chunks_inline");
  } catch (const std::exception& e) {
    return Status(Code::kProtocol, std::string("bench reply: ") + e.what());
  }
  return r;
}

uint64_t checksum(const unsigned char* p, size_t n) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  uint64_t h[4] = {1, 2, 3, 4};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      h[l] = (h[l] ^ w) * kMul;
      h[l] ^= h[l] >> 29;
    }
  }
  uint64_t out = n * kMul;
  for (; i < n; ++i) out = (out ^ p[i]) * kMul;
  for (uint64_t x : h) out = (out ^ x) * kMul ^ (out >> 31);
  return out;
}

Result<uint64_t> checksum_region(const MemRegion& r) {
  if (r.where.kind == MemKind::kHost || r.where.kind == MemKind::kPinned)
    return checksum(static_cast<const unsigned char*>(r.ptr), r.size);
  // A Buffer, not a vector: large ones are mapped and go back to the system when freed, so a
  // long-running server does not keep every size it ever checked in malloc's arenas.
  DMX_ASSIGN_OR_RETURN(Buffer host, Buffer::allocate(MemSpec{}, r.size));
  if (r.size) DMX_RETURN_IF_ERROR(copy_memory(host.region(), r));
  return checksum(static_cast<const unsigned char*>(host.data()), r.size);
}

Result<uint32_t> crc32c_region(const MemRegion& r) {
  return checksum_memory(r.where, r.ptr, r.size, Deadline::after(std::chrono::seconds(60)));
}

Result<uint64_t> fill_random(const MemRegion& r) {
  DMX_ASSIGN_OR_RETURN(Buffer buf, Buffer::allocate(MemSpec{}, r.size));  // as in checksum_region
  auto* host = static_cast<unsigned char*>(buf.data());
  std::mt19937_64 rng(std::random_device{}());
  size_t i = 0;
  for (; i + 8 <= r.size; i += 8) {
    uint64_t x = rng();
    std::memcpy(host + i, &x, 8);
  }
  for (; i < r.size; ++i) host[i] = static_cast<unsigned char>(rng());
  if (r.size) DMX_RETURN_IF_ERROR(copy_memory(r, buf.region().sub(0, r.size)));
  return checksum(host, r.size);
}

Status send_text(Endpoint& ep, uint64_t tag, const std::string& text, Duration timeout) {
  if (text.size() > kControlMax) return Status(Code::kInvalidArgument, "bench control message too long");
  Request r = ep.send(MemRegion{const_cast<char*>(text.data()), text.size(), {}}, tag, with_timeout(timeout));
  return r.wait();
}

Result<std::string> recv_text(Endpoint& ep, uint64_t tag, Duration timeout) {
  std::string buf(kControlMax, '\0');
  Request r = ep.recv(MemRegion{buf.data(), buf.size(), {}}, tag, with_timeout(timeout));
  DMX_RETURN_IF_ERROR(r.wait());
  buf.resize(r.bytes());
  return buf;
}

}  // namespace dmx::bench
