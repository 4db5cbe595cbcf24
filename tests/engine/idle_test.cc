// Idle endpoints: their keepalives share their worker's wake-ups instead of waking it once each.
#include <gtest/gtest.h>

#include <dirent.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/test_util.h"

namespace dmx::test {
namespace {

// Voluntary context switches of the stream workers ("dmx-w*"): each is a sleep something ended.
long worker_wakeups() {
  long n = 0;
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return -1;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string dir = std::string("/proc/self/task/") + e->d_name;
    std::string name;
    std::getline(std::ifstream(dir + "/comm") >> std::ws, name);
    if (!name.starts_with("dmx-w")) continue;
    std::ifstream status(dir + "/status");
    std::string line;
    while (std::getline(status, line))
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) n += std::atol(line.c_str() + 24);
  }
  ::closedir(d);
  return n;
}

// 200 idle TCP endpoint pairs with a 200 ms keepalive send 2,000 keepalives a second and receive
// as many. Each used to wake its worker for itself (more than one wake-up per keepalive); on the
// coalescing grid (25 ms here) a worker wakes a few times per grid step for all of them. Bound:
// one wake-up per 4 keepalives, loose for a busy machine and far below one per keepalive. That the
// keepalives flow shows in health: peer_timeout is 3 s and the endpoints stay idle for 4.
TEST(Idle, KeepalivesOfIdleEndpointsShareTheirWorkersWakeUps) {
  Options o = test_options(1);
  o.set("transport", "tcp").set("keepalive_interval", "200ms").set("peer_timeout", "3s").set("stream_workers", "2").set("max_endpoints", "500").set("max_endpoints_per_peer", "0");
  auto server = Context::create(o), client = Context::create(o);
  ASSERT_TRUE(server.ok() && client.ok());
  auto l = server->listen("tcp://127.0.0.1:0");
  ASSERT_TRUE(l.ok());
  constexpr int kPairs = 200;
  std::vector<Endpoint> eps;
  for (int i = 0; i < kPairs; ++i) {
    auto c = client->connect(l->address());
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    auto s = l->accept(kEventually);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    eps.push_back(std::move(*c));
    eps.push_back(std::move(*s));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // past the set-up's traffic
  long w0 = worker_wakeups();
  ASSERT_GE(w0, 0) << "/proc/self/task unreadable";
  auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  long woke = worker_wakeups() - w0;
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double keepalives = 2 * kPairs * secs / 0.2;  // one per stream per interval
  std::printf("# %ld worker wake-ups for about %.0f keepalives in %.1f s\n", woke, keepalives, secs);
  EXPECT_LT(static_cast<double>(woke), keepalives / 4)
      << woke << " worker wake-ups for about " << keepalives << " keepalives in " << secs << " s";
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  for (auto& e : eps) EXPECT_TRUE(e.health().ok()) << e.health().to_string();
}

}  // namespace
}  // namespace dmx::test
