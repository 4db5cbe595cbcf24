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

int main(int argc, char** argv) {
  std::string mem = "host", proto = "udp";
  uint64_t requests = 2000;
  uint32_t workers = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--mem") mem = v;
    else if (k == "--proto") proto = v;
    else if (k == "--requests") requests = std::stoull(v);
    else if (k == "--workers") workers = static_cast<uint32_t>(std::stoul(v));
    else return std::fprintf(stderr, "unknown option %s\n", k.c_str()), 2;
  }
  auto where = parse_mem_spec(mem);
  if (!where.ok()) return std::fprintf(stderr, "%s\n", where.status().to_string().c_str()), 2;

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
  cfg.geometry.workers = workers;
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
