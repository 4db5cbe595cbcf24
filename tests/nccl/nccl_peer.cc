// The other process of the plugin's two-process tests: one end of a connection, driven as NCCL's
// proxy would, through the plugin loaded with dlopen.
//
//   nccl_peer PLUGIN VERSION ROLE SEED [cuda | cumem:GPU]
//   ROLE recv | sink: listens, prints "HANDLE <hex>", accepts, then receives the plan (recv) or
//                     1 MiB messages until killed (sink)
//   ROLE send | flood: reads "HANDLE <hex>" on stdin, connects, then sends the plan (send) or
//                     1 MiB messages until killed (flood)
//   ROLE props:       inits, prints "PROPS speed <Mbps> latency <us>" for device 0 and exits, or
//                     "FAIL init <result> <the plugin's warning>"
//   cuda: the plan's buffer is cudaMalloc memory on cuda:0; cumem:GPU: memory as NCCL allocates
//   it on that GPU (made the thread's current device first, as NCCL's proxy thread does),
//   registered by dma-buf
// Prints "OK" or "FAIL <why>" last; exits 0 on OK.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iostream>
#include <string>
#include <thread>

#include "tests/nccl/harness.h"

using namespace dmx::nccl;
using namespace dmx::nccl::test;

namespace {

std::string to_hex(const unsigned char* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += d[p[i] >> 4], s += d[p[i] & 15];
  return s;
}

bool from_hex(const std::string& s, unsigned char* out, size_t n) {
  if (s.size() != 2 * n) return false;
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<unsigned char>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
  return true;
}

int fail(const std::string& why) {
  std::printf("FAIL %s\n", why.c_str());
  std::fflush(stdout);
  return 1;
}

// Endless 1 MiB messages in one direction, `window` in flight, until the process is killed.
int endless(Api& api, void* comm, bool send) {
  Region r;
  if (auto e = make_region(false, 8u << 20, &r); !e.empty()) return fail(e);
  void* mh = nullptr;
  if (api.reg_mr(comm, r.data(), 8u << 20, kPtrHost, &mh) != kSuccess) return fail("regMr");
  std::deque<void*> flying;
  std::printf("STREAMING\n");
  std::fflush(stdout);
  // Requests complete in order, so post k reuses the buffer of post k - 8, done by then.
  for (uint64_t posted = 0;;) {
    while (flying.size() < 8) {
      void* req = nullptr;
      unsigned char* p = r.data() + (posted++ % 8) * (1u << 20);
      NcclResult rc;
      if (send) {
        rc = api.isend(comm, p, 1u << 20, 0, mh, &req);
      } else {
        void* d[1] = {p};
        size_t s[1] = {1u << 20};
        int t[1] = {0};
        void* m[1] = {mh};
        rc = api.irecv(comm, 1, d, s, t, m, &req);
      }
      if (rc != kSuccess) return fail("post returned " + std::to_string(rc));
      flying.push_back(req);
    }
    int done = 0;
    NcclResult rc = api.test(flying.front(), &done, nullptr);
    if (rc != kSuccess) return fail("test returned " + std::to_string(rc));
    if (done) flying.pop_front();
    else std::this_thread::yield();  // as NCCL's proxy thread does when idle
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) return fail("usage: nccl_peer PLUGIN VERSION ROLE SEED [cuda | cumem:GPU]");
  set_test_env();
  const std::string role = argv[3];
  const uint64_t seed = std::strtoull(argv[4], nullptr, 10);
  const std::string mem = argc > 5 ? argv[5] : "";
  const bool cumem = mem.rfind("cumem:", 0) == 0;
  const bool cuda = mem == "cuda" || cumem;
  const int gpu = cumem ? std::atoi(mem.c_str() + 6) : 0;
  if (cumem)
    if (auto e = use_gpu(gpu); !e.empty()) return fail(e);
  Api api;
  if (auto e = api.load(argv[1], std::atoi(argv[2])); !e.empty()) return fail(e);
  if (NcclResult r = api.init(); r != kSuccess) {
    std::string why;
    for (const auto& l : logged_lines())
      if (l.find("init failed") != std::string::npos) why = l;
    return fail("init " + std::to_string(r) + " " + why);
  }
  if (role == "props") {
    PropertiesV11 p;
    NcclResult r = api.properties(0, &p);
    if (api.finalize() != kSuccess) return fail("finalize");
    if (r != kSuccess) return fail("properties");
    std::printf("PROPS speed %d latency %g\n", p.speed, p.latency);
    return 0;
  }
  const bool listens = role == "recv" || role == "sink";
  unsigned char handle[kHandleMaxSize] = {};
  void* comm = nullptr;
  if (listens) {
    void* lc = nullptr;
    if (api.listen(0, handle, &lc) != kSuccess) return fail("listen");
    std::printf("HANDLE %s\n", to_hex(handle, sizeof handle).c_str());
    std::fflush(stdout);
    if (NcclResult r = accept_until(api, lc, &comm); r != kSuccess) return fail("accept " + std::to_string(r));
    if (api.close_listen(lc) != kSuccess) return fail("closeListen");
  } else {
    std::string word, hex;
    if (!(std::cin >> word >> hex) || word != "HANDLE" || !from_hex(hex, handle, sizeof handle))
      return fail("no handle on stdin");
    if (NcclResult r = connect_until(api, 0, handle, &comm); r != kSuccess) return fail("connect " + std::to_string(r));
  }
  if (role == "flood" || role == "sink") return endless(api, comm, role == "flood");

  Plan plan = make_plan(seed, 150, 8);
  Region region;
  if (auto e = make_region(cumem ? RegionKind::kNcclCuMem : cuda ? RegionKind::kCuda : RegionKind::kHost, gpu,
                           plan.region_bytes, &region);
      !e.empty())
    return fail(e);
  if (role == "send")
    if (auto e = write_region(region, sender_bytes(plan, seed)); !e.empty()) return fail(e);
  Side side{&api, comm, region.data(), nullptr, cuda};
  if (auto e = register_region(api, comm, region, plan.region_bytes, &side.mh); !e.empty()) return fail(e);
  std::string err = role == "send" ? run_sends(side, plan, seed, 200) : run_recvs(side, plan, seed, 32);
  if (!err.empty()) return fail(err);
  if (role == "recv") {
    std::vector<unsigned char> got(plan.region_bytes);
    if (auto e = read_region(region, &got); !e.empty()) return fail(e);
    if (auto e = verify(got, plan, seed); !e.empty()) return fail(e);
  }
  if (api.dereg_mr(comm, side.mh) != kSuccess) return fail("deregMr");
  // Wait for the other side's word before closing, so that closing does not race its last test().
  std::string word;
  std::cin >> word;
  NcclResult rc = role == "send" ? api.close_send(comm) : api.close_recv(comm);
  if (rc != kSuccess) return fail("close " + std::to_string(rc));
  if (api.finalize() != kSuccess) return fail("finalize");
  std::printf("OK\n");
  std::fflush(stdout);
  return 0;
}
