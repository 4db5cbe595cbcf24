// Threads are the scarce resource while each stream has its own worker: a peer cannot ask for more
// streams than max_streams, a context holds at most max_endpoints, both refused with a reason that
// names the setting, and every thread is gone once its endpoint is closed.
#include <dirent.h>
#include <gtest/gtest.h>

#include <thread>

#include "hostile/hostile_util.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;

int threads_now() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
  }
  return n;
}

TEST(Limits, PeerAskingForTooManyStreamsIsRefusedClearly) {
  Options so = test_options(4);
  so.set("max_streams", "4");
  Server s = make_server(so);
  auto client = Context::create(test_options(8));
  ASSERT_TRUE(client.ok());
  auto ep = client->connect(s.listener.address());
  ASSERT_FALSE(ep.ok());
  EXPECT_EQ(ep.status().code(), Code::kResourceExhausted) << ep.status().to_string();
  EXPECT_NE(ep.status().message().find("max_streams"), std::string::npos) << ep.status().to_string();
  expect_serves_a_good_client(s);  // 4 streams: welcome
}

TEST(Limits, EndpointsPerContextAreCappedAndComeBack) {
  Options so = test_options(2);
  so.set("max_endpoints", "3");
  Server s = make_server(so);
  auto client = Context::create(test_options(2));
  ASSERT_TRUE(client.ok());
  std::vector<Endpoint> mine, theirs;
  for (int i = 0; i < 3; ++i) {
    auto c = client->connect(s.listener.address());
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    mine.push_back(std::move(*c));
    auto e = s.listener.accept(10s);
    ASSERT_TRUE(e.ok());
    theirs.push_back(std::move(*e));
  }
  auto fourth = client->connect(s.listener.address());
  ASSERT_FALSE(fourth.ok());
  EXPECT_EQ(fourth.status().code(), Code::kResourceExhausted) << fourth.status().to_string();
  EXPECT_NE(fourth.status().message().find("max_endpoints"), std::string::npos) << fourth.status().to_string();
  // One closes: there is room again.
  EXPECT_TRUE(theirs[0].close().ok());
  EXPECT_TRUE(mine[0].close().ok());
  auto again = client->connect(s.listener.address());
  EXPECT_TRUE(again.ok()) << again.status().to_string();
  auto again_server = s.listener.accept(10s);  // the server's side exists (and is counted) by now
  ASSERT_TRUE(again_server.ok());
  // The connecting side is bounded as well, before it dials.
  Options co = test_options(2);
  co.set("max_endpoints", "1");
  auto small = Context::create(co);
  auto first = small->connect(s.listener.address());
  ASSERT_FALSE(first.ok());  // the server is full again (3 held)
  theirs.clear();
  mine.clear();
}

TEST(Limits, EveryThreadIsGoneAfterItsEndpointCloses) {
  std::thread([] {}).join();  // ThreadSanitizer starts a thread of its own with a process's first
  int before = threads_now();
  {
    // TCP: with a payload path an endpoint opens one stream, not four.
    Server s = make_server(test_options(4).set("transport", "tcp"));
    auto client = Context::create(test_options(4).set("transport", "tcp"));
    std::vector<Endpoint> eps;
    for (int i = 0; i < 10; ++i) {
      auto c = client->connect(s.listener.address());
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      eps.push_back(std::move(*c));
      auto e = s.listener.accept(10s);
      ASSERT_TRUE(e.ok());
      eps.push_back(std::move(*e));
    }
    EXPECT_GE(threads_now(), before + 80) << "10 endpoint pairs of 4 streams";
    for (auto& e : eps) EXPECT_TRUE(e.close().ok());
  }
  int after = threads_now();
  for (auto until = Clock::now() + 5s; Clock::now() < until && after > before; after = threads_now())
    std::this_thread::sleep_for(10ms);
  // One more is the reaper (src/core/reaper.h), started if a worker happened to drop its own
  // endpoint; 10 endpoint pairs leaking would leave 80.
  EXPECT_LE(after, before + 1) << "threads left behind by closed endpoints";
}

// Two processes of one host agree shm (and the shm pipe): one stream, so an endpoint costs its
// stream's worker and the shm path's thread, whatever the streams setting.
TEST(Limits, SameHostEndpointsOpenOneStream) {
  std::thread([] {}).join();
  int before = threads_now();
  Server s = make_server(test_options(8));
  auto client = Context::create(test_options(8));
  std::vector<Endpoint> eps;
  constexpr int kPairs = 8;
  for (int i = 0; i < kPairs; ++i) {
    auto c = client->connect(s.listener.address());
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    if (c->stats().transport != "shm") GTEST_SKIP() << "shm not agreed here: " << c->stats().reason;
    EXPECT_EQ(c->stats().streams, 1) << c->stats().reason;
    eps.push_back(std::move(*c));
    auto e = s.listener.accept(10s);
    ASSERT_TRUE(e.ok());
    eps.push_back(std::move(*e));
  }
  int grew = threads_now() - before;
  std::printf("%d same-host endpoint pairs with streams=8: %d threads (%.1f per endpoint)\n", kPairs, grew,
              grew / (2.0 * kPairs));
  // 2 per endpoint, plus the listener's and a few set-up threads still finishing.
  EXPECT_LE(grew, 2 * 2 * kPairs + 4);
  for (auto& e : eps) EXPECT_TRUE(e.close().ok());
}

}  // namespace
}  // namespace dmx::test
