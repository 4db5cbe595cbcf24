// Kernel-initiated 8-byte puts (dmx/device.cuh), timed by the kernel's own clock (%globaltimer):
// GPU0 -> GPU1 between two processes, per transport and gpu_push setting, one JSON line each:
//   put:  from the kernel posting an 8-byte write + notification to its landed completion;
//   half: half the round trip of a ping-pong of such writes, the peer's kernel answering each.
//
//   direct: (cuda_ipc, --modes direct) the kernel stores 8 B and a signal word into the peer's
//     mapped memory itself (block_put_signal); per round the time to store and fence the bytes,
//     to store and fence the signal, and to tell the host, and their sum (put + signal);
//   direct_half: half the round trip of a ping-pong of direct puts, each side's kernel waiting
//     on its own signal word.
//
//   device_put_bench [--iters N] [--transports cuda_ipc,tcp] [--push on,off] [--modes ring,direct]
//
// CUDA is touched only in forked children (a child forked after the parent initialised CUDA
// cannot use it). Prints {"bench":"device_put","skipped":...} without two processes' GPUs.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "device/device_kernels.h"
#include "dmx/dmx.h"

namespace {

using namespace std::chrono_literals;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

dmx::Options options(const std::string& transport, const std::string& push) {
  dmx::Options o;
  o.set("auth_key", "dmx-bench-key-0123456789").set("log_level", "warn").set("streams", "1");
  o.set("transport", transport).set("gpu_push", push);
  return o;
}

bool send_bytes(dmx::Endpoint& ep, std::vector<unsigned char> bytes, uint64_t tag) {
  return ep.send(dmx::MemRegion{bytes.data(), bytes.size()}, tag).wait(30s).ok();
}
std::vector<unsigned char> recv_bytes(dmx::Endpoint& ep, uint64_t tag) {
  std::vector<unsigned char> b(256);
  dmx::Request r = ep.recv(dmx::MemRegion{b.data(), b.size()}, tag);
  if (!r.wait(60s).ok()) return {};
  b.resize(r.bytes());
  return b;
}

#define CHECK(cond, code)                                                     \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "device_put_bench: %s failed (line %d)\n", #cond, __LINE__); \
      return code;                                                            \
    }                                                                         \
  } while (0)

double pct(std::vector<uint64_t> v, double q, double div) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))] / div;
}

// Direct puts (cuda_ipc): each side exports its 64-byte target (bytes 0-7: data, 8-15: the signal
// word) as a device window and maps the peer's; the client's kernel stores 8 B + the signal itself.
int direct_side(bool server, dmx::Endpoint& ep, const dmx::DeviceHandle& h, dmx::Buffer& target, dmx::Buffer& src,
                bool pong, int iters, int* result, uint64_t* steps) {
  std::vector<unsigned char> zeros(64, 0);
  CHECK(dmx::copy_memory(target.region(), dmx::MemRegion{zeros.data(), zeros.size()}).ok(), 50);
  auto mine = ep.export_device_window(target.region());
  if (!mine.ok()) std::fprintf(stderr, "device_put_bench: export_device_window: %s\n", mine.status().to_string().c_str());
  CHECK(mine.ok(), 51);
  CHECK(send_bytes(ep, *mine, 4), 52);
  auto theirs_bytes = recv_bytes(ep, 4);
  auto theirs = ep.import_device_window(theirs_bytes);
  if (!theirs.ok()) std::fprintf(stderr, "device_put_bench: import_device_window: %s\n", theirs.status().to_string().c_str());
  CHECK(theirs.ok(), 53);
  dmx::DeviceWindow data{theirs->base, 8}, signal{theirs->base + 8, 8};
  auto* word = reinterpret_cast<const uint64_t*>(static_cast<char*>(target.data()) + 8);
  auto* s = static_cast<unsigned char*>(src.data());
  CHECK(send_bytes(ep, {1}, 2), 54);  // ready
  CHECK(!recv_bytes(ep, 2).empty(), 55);
  int rc = -1;
  if (server) {
    if (pong) CHECK(dmx::test::run_direct_pong(h, s, data, signal, word, iters, result).empty(), 56);
    if (pong) CHECK(dmx::test::copy_to_host(&rc, result, sizeof rc).empty() && rc == 0, 57);
    CHECK(!recv_bytes(ep, 3).empty(), 58);
    return 0;
  }
  CHECK(dmx::test::run_direct_ping(h, s, data, signal, word, iters, pong, steps, result).empty(), 59);
  CHECK(dmx::test::copy_to_host(&rc, result, sizeof rc).empty(), 60);
  if (rc != 0) std::fprintf(stderr, "device_put_bench: the kernel's call returned %d\n", rc);
  CHECK(rc == 0, 61);
  std::vector<uint64_t> t(3 * static_cast<size_t>(iters));
  CHECK(dmx::test::copy_to_host(t.data(), steps, sizeof(uint64_t) * t.size()).empty(), 62);
  // The host is told afterwards: give the channel a moment to count the last ones.
  for (int i = 0; i < 100 && ep.stats().device_direct_puts < static_cast<uint64_t>(iters); ++i)
    std::this_thread::sleep_for(10ms);
  uint64_t counted = ep.stats().device_direct_puts;
  CHECK(send_bytes(ep, {1}, 3), 63);
  std::vector<uint64_t> store, sig, told, total;
  for (int i = iters / 10; i < iters; ++i) {  // the first tenth is warm-up
    store.push_back(t[3 * i]);
    sig.push_back(t[3 * i + 1]);
    told.push_back(t[3 * i + 2]);
    total.push_back(t[3 * i] + t[3 * i + 1]);
  }
  if (pong) {
    std::printf("{\"bench\":\"device_put\",\"mode\":\"direct_half\",\"transport\":\"cuda_ipc\",\"size_bytes\":8,"
                "\"samples\":%zu,\"p50_us\":%.2f,\"p99_us\":%.2f,\"min_us\":%.2f,\"host_counted\":%llu}\n",
                store.size(), pct(store, 0.5, 2000.0), pct(store, 0.99, 2000.0), pct(store, 0, 2000.0),
                static_cast<unsigned long long>(counted));
  } else {
    std::printf("{\"bench\":\"device_put\",\"mode\":\"direct\",\"transport\":\"cuda_ipc\",\"size_bytes\":8,"
                "\"samples\":%zu,\"p50_us\":%.2f,\"p99_us\":%.2f,\"store_fence_p50_us\":%.2f,"
                "\"signal_fence_p50_us\":%.2f,\"tell_host_p50_us\":%.2f,\"host_counted\":%llu}\n",
                total.size(), pct(total, 0.5, 1000.0), pct(total, 0.99, 1000.0), pct(store, 0.5, 1000.0),
                pct(sig, 0.5, 1000.0), pct(told, 0.5, 1000.0), static_cast<unsigned long long>(counted));
  }
  std::fflush(stdout);
  return 0;
}

// One process's side. Both register an 8-byte target and swap RemoteRegions (tag 1), then the
// client runs the timed kernel; in ping-pong the server's kernel answers.
int side(bool server, const std::string& addr_or_empty, int pipe_w, const std::string& transport,
         const std::string& push, bool pong, bool direct, int iters, int gpu) {
  auto ctx = dmx::Context::create(options(transport, push));
  CHECK(ctx.ok(), 10);
  dmx::Endpoint ep;
  dmx::Listener l;
  if (server) {
    auto lr = ctx->listen("tcp://127.0.0.1:0");
    CHECK(lr.ok(), 11);
    l = std::move(*lr);
    std::string a = l.address();
    CHECK(::write(pipe_w, a.data(), a.size()) == static_cast<ssize_t>(a.size()), 12);
    ::close(pipe_w);
    auto e = l.accept(30s);
    CHECK(e.ok(), 13);
    ep = std::move(*e);
  } else {
    auto e = ctx->connect(addr_or_empty);
    CHECK(e.ok(), 14);
    ep = std::move(*e);
  }
  CHECK(dmx::test::set_device(gpu).empty(), 15);
  auto target = dmx::Buffer::allocate(dmx::MemSpec{dmx::MemKind::kCuda, gpu}, 64);
  auto src = dmx::Buffer::allocate(dmx::MemSpec{dmx::MemKind::kCuda, gpu}, 64);
  CHECK(target.ok() && src.ok(), 16);
  auto reg = ctx->register_memory(target->region());
  CHECK(reg.ok(), 17);
  CHECK(send_bytes(ep, reg->remote().serialize(), 1), 18);
  auto peer_bytes = recv_bytes(ep, 1);
  auto peer = dmx::RemoteRegion::parse(peer_bytes.data(), peer_bytes.size());
  CHECK(peer.ok(), 19);
  // The path's first use (handles, engines, staging) from the host, not under a spinning kernel.
  CHECK(ep.write(src->region().sub(0, 8), *peer, 0).wait(30s).ok(), 20);
  dmx::DeviceHandleOptions ho;
  ho.device = gpu;
  ho.notifications = true;
  ho.timeout = 30s;
  auto h = ep.device_handle(ho);
  CHECK(h.ok(), 21);
  dmx::DeviceRemote dst{peer->key, peer->size};
  auto* result = static_cast<int*>(dmx::test::device_alloc(sizeof(int)));
  auto* times = static_cast<uint64_t*>(dmx::test::device_alloc(sizeof(uint64_t) * 3 * iters));
  CHECK(result && times, 22);
  if (direct) return direct_side(server, ep, *h, *target, *src, pong, iters, result, times);
  CHECK(send_bytes(ep, {1}, 2), 23);  // ready
  CHECK(!recv_bytes(ep, 2).empty(), 24);
  int rc = -1;
  if (server) {
    if (pong) CHECK(dmx::test::run_pong(*h, static_cast<unsigned char*>(src->data()), dst, iters, result).empty(), 25);
    if (pong) CHECK(dmx::test::copy_to_host(&rc, result, sizeof rc).empty() && rc == 0, 26);
    CHECK(!recv_bytes(ep, 3).empty(), 27);  // the client is done
    return 0;
  }
  CHECK(dmx::test::run_ping(*h, static_cast<unsigned char*>(src->data()), dst, iters, pong, times, result).empty(), 28);
  CHECK(dmx::test::copy_to_host(&rc, result, sizeof rc).empty(), 29);
  if (rc != 0) std::fprintf(stderr, "device_put_bench: the kernel's call returned %d\n", rc);
  CHECK(rc == 0, 30);
  std::vector<uint64_t> t(iters);
  CHECK(dmx::test::copy_to_host(t.data(), times, sizeof(uint64_t) * iters).empty(), 31);
  CHECK(send_bytes(ep, {1}, 3), 32);
  // The first tenth is warm-up.
  t.erase(t.begin(), t.begin() + iters / 10);
  std::sort(t.begin(), t.end());
  double div = pong ? 2000.0 : 1000.0;
  auto pct = [&](double q) { return t[std::min(t.size() - 1, static_cast<size_t>(q * t.size()))] / div; };
  dmx::EndpointStats st = ep.stats();
  std::string detail = st.paths.empty() ? st.gpu_push : st.paths[0].detail;
  for (char& c : detail)
    if (c == '"' || c == '\\') c = '\'';
  std::printf(
      "{\"bench\":\"device_put\",\"mode\":\"%s\",\"transport\":\"%s\",\"gpu_push\":\"%s\",\"size_bytes\":8,"
      "\"samples\":%zu,\"p50_us\":%.2f,\"p99_us\":%.2f,\"min_us\":%.2f,\"chosen\":\"%s\",\"detail\":\"%s\"}\n",
      pong ? "half" : "put", transport.c_str(), push.c_str(), t.size(), pct(0.5), pct(0.99), t.front() / div,
      st.transport.c_str(), detail.c_str());
  std::fflush(stdout);
  return 0;
}

int run_one(const std::string& transport, const std::string& push, bool pong, bool direct, int iters,
            int server_gpu) {
  int fds[2];
  if (::pipe(fds) != 0) return 1;
  pid_t s = ::fork();
  if (s == 0) {
    ::close(fds[0]);
    ::_exit(side(true, "", fds[1], transport, push, pong, direct, iters, server_gpu));
  }
  ::close(fds[1]);
  char buf[256] = {};
  ssize_t got = ::read(fds[0], buf, sizeof buf - 1);
  ::close(fds[0]);
  pid_t c = ::fork();
  if (c == 0) ::_exit(got > 0 ? side(false, std::string(buf, got), -1, transport, push, pong, direct, iters, 0) : 40);
  int cs = 0, ss = 0;
  ::waitpid(c, &cs, 0);
  if (!(WIFEXITED(cs) && WEXITSTATUS(cs) == 0)) ::kill(s, SIGKILL);
  ::waitpid(s, &ss, 0);
  bool ok = WIFEXITED(cs) && WEXITSTATUS(cs) == 0 && WIFEXITED(ss) && WEXITSTATUS(ss) == 0;
  if (!ok)
    std::printf("{\"bench\":\"device_put\",\"mode\":\"%s\",\"transport\":\"%s\",\"gpu_push\":\"%s\",\"error\":\"client "
                "status %d, server status %d\"}\n",
                direct ? (pong ? "direct_half" : "direct") : (pong ? "half" : "put"), transport.c_str(), push.c_str(), cs,
                ss);
  return ok ? 0 : 1;
}

// The number of CUDA devices, asked in a child.
int gpu_count(std::string* why) {
  int fds[2];
  if (::pipe(fds) != 0) return 0;
  pid_t p = ::fork();
  if (p == 0) {
    ::close(fds[0]);
    std::string text;
    dmx::Status s = dmx::mem_available(dmx::MemSpec{dmx::MemKind::kCuda, 0});
    if (!s.ok()) text = "0" + s.message();
    else text = dmx::mem_available(dmx::MemSpec{dmx::MemKind::kCuda, 1}).ok() ? "2" : "1";
    (void)!::write(fds[1], text.data(), text.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  char buf[1024] = {};
  ssize_t n = ::read(fds[0], buf, sizeof buf - 1);
  ::close(fds[0]);
  ::waitpid(p, nullptr, 0);
  if (n <= 0) {
    *why = "the probe child failed";
    return 0;
  }
  if (buf[0] == '0') *why = std::string(buf + 1, n - 1);
  return buf[0] - '0';
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 2000;
  std::string transports = "cuda_ipc,tcp", pushes = "on,off", modes = "ring,direct";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--iters") iters = std::max(20, std::atoi(argv[i + 1]));
    else if (a == "--transports") transports = argv[i + 1];
    else if (a == "--push") pushes = argv[i + 1];
    else if (a == "--modes") modes = argv[i + 1];
    else {
      std::fprintf(stderr,
                   "usage: device_put_bench [--iters N] [--transports cuda_ipc,tcp] [--push on,off] [--modes ring,direct]\n");
      return 2;
    }
  }
  std::string why;
  int gpus = gpu_count(&why);
  if (gpus < 1) {
    for (char& c : why)
      if (c == '"' || c == '\\' || c == '\n') c = ' ';
    std::printf("{\"bench\":\"device_put\",\"skipped\":\"needs a GPU: %s\"}\n", why.c_str());
    return 0;
  }
  int failures = 0;
  const std::vector<std::string> ms = split(modes);
  auto has = [&](const char* m) { return std::find(ms.begin(), ms.end(), m) != ms.end(); };
  if (has("ring"))
    for (const std::string& t : split(transports))
      for (const std::string& p : split(pushes))
        for (bool pong : {false, true}) failures += run_one(t, p, pong, false, iters, gpus > 1 ? 1 : 0);
  // Direct puts: the kernel stores into the peer's mapped memory; cuda_ipc only, push irrelevant.
  if (has("direct"))
    for (bool pong : {false, true}) failures += run_one("cuda_ipc", "off", pong, true, iters, gpus > 1 ? 1 : 0);
  return failures == 0 ? 0 : 1;
}
