// idle_endpoints — what N connected endpoints cost one server process: threads, memory, file
// descriptors, idle or busy. Server and client contexts live in this one process, so the figures
// are for both sides; the server's share is half (each side runs the same threads per endpoint).
//
//   idle_endpoints [N (1000)] [transport (tcp)] [streams (1)] [busy seconds (0)] [scope] [idle seconds (3)]
//
// busy > 0: every endpoint pair then moves 1 MiB messages, two in flight, for that long; the
// threads are counted while they do, and the total rate is printed. scope: stream_worker_scope
// (context or endpoint; unset: the build's default, so older builds run too).
#include <dirent.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "dmx/dmx.h"

namespace {

long status_field(const char* name) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(name, 0) == 0) return std::atol(line.c_str() + std::string(name).size());
  return -1;
}

int open_fds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n - 2;
}

// Voluntary context switches of every thread of this process: each is a sleep that something woke.
long wakeups() {
  long n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/status");
      std::string line;
      while (std::getline(f, line))
        if (line.rfind("voluntary_ctxt_switches:", 0) == 0) n += std::atol(line.c_str() + 24);
    }
    closedir(d);
  }
  return n;
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// Each pair (eps[2k] client, eps[2k+1] server) keeps two 1 MiB messages in flight; returns false
// when an operation fails or a message arrives altered.
bool run_busy(std::vector<dmx::Endpoint>& eps, double seconds, long threads0) {
  constexpr size_t kSize = 1 << 20;
  struct Lane {
    std::vector<unsigned char> src, dst[2];
    dmx::Request send[2], recv[2];
  };
  std::vector<Lane> lanes(eps.size() / 2);
  uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  for (auto& l : lanes) {
    l.src.resize(kSize);
    for (auto& b : l.src) b = static_cast<unsigned char>((seed = seed * 6364136223846793005ULL + 1442695040888963407ULL) >> 56);
    for (auto& d : l.dst) d.resize(kSize);
  }
  auto post = [&](size_t k, int slot) {
    Lane& l = lanes[k];
    l.recv[slot] = eps[2 * k + 1].recv(dmx::MemRegion{l.dst[slot].data(), kSize, {}}, 7);
    l.send[slot] = eps[2 * k].send(dmx::MemRegion{l.src.data(), kSize, {}}, 7);
  };
  for (size_t k = 0; k < lanes.size(); ++k) post(k, 0), post(k, 1);
  long threads_max = 0;
  uint64_t messages = 0;
  auto t0 = std::chrono::steady_clock::now(), last_count = t0;
  auto until = t0 + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    for (size_t k = 0; k < lanes.size(); ++k)
      for (int slot = 0; slot < 2; ++slot) {
        Lane& l = lanes[k];
        // In posting order: a blocking wait, so that this thread takes no core from the workers.
        (void)l.recv[slot].wait(std::chrono::seconds(30));
        (void)l.send[slot].wait(std::chrono::seconds(30));
        if (!l.recv[slot].status().ok() || !l.send[slot].status().ok() || l.dst[slot] != l.src) {
          std::fprintf(stderr, "pair %zu: %s / %s%s\n", k, l.send[slot].status().to_string().c_str(),
                       l.recv[slot].status().to_string().c_str(), l.dst[slot] != l.src ? " (bytes differ)" : "");
          return false;
        }
        ++messages;
        post(k, slot);
      }
    if (std::chrono::steady_clock::now() - last_count > std::chrono::milliseconds(100)) {
      threads_max = std::max(threads_max, status_field("Threads:") - threads0);
      last_count = std::chrono::steady_clock::now();
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& l : lanes)
    for (int slot = 0; slot < 2; ++slot) (void)l.recv[slot].wait(std::chrono::seconds(30)), (void)l.send[slot].wait(std::chrono::seconds(30));
  std::printf("{\"busy_pairs\":%zu,\"busy_s\":%.1f,\"threads_busy\":%ld,\"gb_per_s\":%.2f}\n", lanes.size(), secs,
              threads_max, static_cast<double>(messages) * kSize / secs / 1e9);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 1000;
  std::string transport = argc > 2 ? argv[2] : "tcp";
  std::string streams = argc > 3 ? argv[3] : "1";
  double busy = argc > 4 ? std::atof(argv[4]) : 0;
  dmx::Options o;
  o.set("insecure", "true").set("transport", transport).set("streams", streams).set("log_level", "warn");
  if (argc > 5 && argv[5][0] != '\0') o.set("stream_worker_scope", argv[5]);
  double idle = argc > 6 ? std::max(0.1, std::atof(argv[6])) : 3;
  o.set("max_endpoints", std::to_string(n + 10)).set("max_endpoints_per_peer", "0").set("keepalive_interval", "1s");
  auto server = dmx::Context::create(o);
  auto client = dmx::Context::create(o);
  if (!server.ok() || !client.ok()) {
    std::fprintf(stderr, "context: %s\n", (server.ok() ? client.status() : server.status()).to_string().c_str());
    return 1;
  }
  auto listener = server->listen("tcp://127.0.0.1:0");
  if (!listener.ok()) return 1;
  long threads0 = status_field("Threads:"), rss0 = status_field("VmRSS:");
  int fds0 = open_fds();
  std::vector<dmx::Endpoint> eps;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    auto c = client->connect(listener->address());
    auto s = c.ok() ? listener->accept(std::chrono::seconds(10)) : dmx::Result<dmx::Endpoint>(c.status());
    if (!c.ok() || !s.ok()) {
      std::fprintf(stderr, "endpoint %d: %s\n", i, (c.ok() ? s.status() : c.status()).to_string().c_str());
      return 1;
    }
    if (i == 0) std::printf("# transport %s, %u stream(s): %s\n", c->stats().transport.c_str(), c->stats().streams,
                            c->stats().reason.c_str());
    eps.push_back(std::move(*c));
    eps.push_back(std::move(*s));
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  long threads = status_field("Threads:") - threads0, rss = status_field("VmRSS:") - rss0;
  int fds = open_fds() - fds0;
  std::printf("{\"endpoints_per_side\":%d,\"transport\":\"%s\",\"streams\":%s,\"threads\":%ld,"
              "\"threads_per_endpoint\":%.2f,\"rss_kib\":%ld,\"rss_kib_per_endpoint\":%.1f,\"fds\":%d,"
              "\"fds_per_endpoint\":%.2f,\"connect_s\":%.2f}\n",
              n, transport.c_str(), streams.c_str(), threads, threads / (2.0 * n), rss, rss / (2.0 * n), fds,
              fds / (2.0 * n), secs);
  if (busy > 0 && !run_busy(eps, busy, threads0)) return 1;
  // Idle for a few keepalive rounds: every endpoint must still be healthy, and idle endpoints
  // should cost next to no CPU.
  double cpu0 = cpu_seconds();
  long wake0 = wakeups();
  std::this_thread::sleep_for(std::chrono::duration<double>(idle));
  double cpu = cpu_seconds() - cpu0;
  long woke = wakeups() - wake0 - 1;  // less this thread's own sleep
  std::printf("# idle CPU: %.1f %% of one core over %.1f s, %.0f thread wake-ups/s\n", cpu / idle * 100, idle,
              woke / idle);
  int sick = 0;
  for (auto& e : eps) sick += e.health().ok() ? 0 : 1;
  std::printf("# after %.1f s idle: %d of %zu endpoints unhealthy\n", idle, sick, eps.size());
  for (auto& e : eps) (void)e.close();
  return sick == 0 ? 0 : 1;
}
