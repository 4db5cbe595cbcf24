// Lynx example: a face-verification server. A client sends [u32 person id][28x28 image]; a
// worker (a CPU thread, or a GPU thread block with --mem cuda:0) fetches that person's
// reference image from an external key-value service through its client queue, compares, and
// answers [u32 match][u32 distance]. The dispatcher terminates UDP/TCP and forwards the calls.
//
//   lynx_face_verify [--mem host|cuda:0] [--proto udp|tcp] [--requests N] [--workers W]
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "mqueue/kv_service.h"
#include "mqueue/load.h"
#include "mqueue/server.h"

using namespace dmx;
using namespace dmx::mqueue;

namespace {

constexpr const char* kUsage =
    "usage: lynx_face_verify [--mem host|cuda:N] [--proto udp|tcp] [--requests N] [--workers W]\n"
    "  --requests  1 to 100000000 (default 2000)\n"
    "  --workers   1 to 64 (default 2)\n";

// A whole decimal number in [lo, hi], or an error naming the option (no std::stoul: it throws,
// and accepts "12abc" and "-1").
bool parse_count(const std::string& opt, const std::string& v, uint64_t lo, uint64_t hi, uint64_t* out) {
  uint64_t n = 0;
  bool ok = !v.empty() && v.size() <= 19;
  for (char c : v) ok = ok && c >= '0' && c <= '9';
  if (ok) {
    for (char c : v) n = n * 10 + static_cast<uint64_t>(c - '0');
    ok = n >= lo && n <= hi;
  }
  if (!ok) {
    std::fprintf(stderr, "lynx_face_verify: %s '%s': expected a whole number from %llu to %llu\n%s", opt.c_str(),
                 v.c_str(), static_cast<unsigned long long>(lo), static_cast<unsigned long long>(hi), kUsage);
    return false;
  }
  *out = n;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mem = "host", proto = "udp";
  uint64_t requests = 2000, workers = 2;
  for (int i = 1; i < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--help" || k == "-h") return std::printf("%s", kUsage), 0;
    if (k != "--mem" && k != "--proto" && k != "--requests" && k != "--workers")
      return std::fprintf(stderr, "lynx_face_verify: unknown option '%s'\n%s", k.c_str(), kUsage), 2;
    if (i + 1 >= argc) return std::fprintf(stderr, "lynx_face_verify: %s needs a value\n%s", k.c_str(), kUsage), 2;
    std::string v = argv[i + 1];
    if (k == "--mem") {
      mem = v;
    } else if (k == "--proto") {
      if (v != "udp" && v != "tcp")
        return std::fprintf(stderr, "lynx_face_verify: --proto '%s': udp or tcp\n%s", v.c_str(), kUsage), 2;
      proto = v;
    } else if (k == "--requests") {
      if (!parse_count(k, v, 1, 100000000, &requests)) return 2;
    } else if (!parse_count(k, v, 1, 64, &workers)) {
      return 2;
    }
  }
  auto where = parse_mem_spec(mem);
  if (!where.ok()) return std::fprintf(stderr, "lynx_face_verify: --mem: %s\n%s", where.status().to_string().c_str(), kUsage), 2;

  // The database: 100 people, one 28x28 reference image each.
  constexpr uint32_t kPeople = 100, kImage = 28 * 28;
  auto kv = KvService::start("127.0.0.1:0");
  if (!kv.ok()) return std::fprintf(stderr, "%s\n", kv.status().to_string().c_str()), 1;
  std::mt19937 rng(42);
  std::vector<std::vector<uint8_t>> faces(kPeople, std::vector<uint8_t>(kImage));
  for (uint32_t id = 0; id < kPeople; ++id) {
    for (auto& b : faces[id]) b = static_cast<uint8_t>(rng());
    (*kv)->put(id, faces[id]);
  }

  ServerConfig cfg;
  cfg.geometry.workers = static_cast<uint32_t>(workers);
  cfg.geometry.slots = 64;
  cfg.geometry.max_request = 4 + kImage;
  cfg.geometry.max_response = 8;
  cfg.geometry.call_slots = 4;
  cfg.geometry.max_call = kImage;
  cfg.memory = *where;
  cfg.app = AppKind::kFaceVerify;
  cfg.dispatch.udp = cfg.dispatch.tcp = "127.0.0.1:0";
  cfg.dispatch.service = (*kv)->address();
  auto server = Server::start(cfg);
  if (!server.ok()) return std::fprintf(stderr, "%s\n", server.status().to_string().c_str()), 1;

  // Even requests show the person's own face with a little noise (a match), odd ones a stranger.
  uint64_t matches = 0;
  LoadConfig load;
  load.udp = proto == "udp";
  load.address = load.udp ? (*server)->dispatcher().udp_address() : (*server)->dispatcher().tcp_address();
  load.clients = 8;
  load.requests = requests;
  load.sizes = {4 + kImage};
  load.make = [&](std::vector<uint8_t>& req, uint64_t i) {
    uint32_t id = static_cast<uint32_t>(i % kPeople);
    std::memcpy(req.data(), &id, 4);
    for (uint32_t k = 0; k < kImage; ++k)
      req[4 + k] = i % 2 ? static_cast<uint8_t>(rng()) : static_cast<uint8_t>(faces[id][k] ^ (rng() & 3));
  };
  load.check = [&](std::span<const uint8_t> req, std::span<const uint8_t> resp) {
    uint32_t got[2];
    if (resp.size() != 8) return false;
    std::memcpy(got, resp.data(), 8);
    uint32_t id;
    std::memcpy(&id, req.data(), 4);
    uint64_t d = 0;
    for (uint32_t k = 0; k < kImage; ++k) d += std::abs(int(req[4 + k]) - int(faces[id][k]));
    matches += got[0];
    return got[0] == (face_match(d, kImage, kImage) ? 1u : 0u) && got[1] == d;
  };
  auto r = run_load(load);
  if (!r.ok()) return std::fprintf(stderr, "%s\n", r.status().to_string().c_str()), 1;
  Status st = (*server)->stop();
  DispatcherStats ds = (*server)->dispatcher().stats();
  std::printf("face verification on %s workers over %s: %llu answers ok (%llu matches), %llu wrong, %llu lost\n",
              mem.c_str(), proto.c_str(), static_cast<unsigned long long>(r->ok),
              static_cast<unsigned long long>(matches), static_cast<unsigned long long>(r->bad),
              static_cast<unsigned long long>(r->lost));
  std::printf("%.0f req/s, p50 %.1f us, p99 %.1f us; %llu calls to the key-value service\n",
              static_cast<double>(r->ok) / r->seconds, r->percentile(50), r->percentile(99),
              static_cast<unsigned long long>(ds.calls));
  return r->ok == requests && st.ok() ? 0 : 1;
}
