// Threads do not grow with streams or endpoints: a context runs every stream on its set of workers.
// A peer cannot ask for more streams than max_streams, a context holds at most max_endpoints, both
// refused with a reason that names the setting, and every thread is gone once its context is.
#include <gtest/gtest.h>

#include <thread>

#include "hostile/hostile_util.h"
#include "proc_threads.h"
#include "test_env.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;

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

// 10 endpoint pairs of 4 TCP streams, all moving bytes at once: 80 streams on each context's 3
// workers (and its closer), not a thread each. In the endpoint scope, one thread per endpoint.
void busy_endpoints_add_few_threads(const char* scope, int allowed) {
  std::thread([] {}).join();  // ThreadSanitizer starts a thread of its own with a process's first
  int before = process_threads();
  {
    auto opts = test_options(4).set("transport", "tcp").set("stream_workers", "3").set("stream_worker_scope", scope);
    Server s = make_server(opts);
    auto client = Context::create(opts);
    std::vector<Endpoint> mine, theirs;
    for (int i = 0; i < 10; ++i) {
      auto c = client->connect(s.listener.address());
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      mine.push_back(std::move(*c));
      auto e = s.listener.accept(10s);
      ASSERT_TRUE(e.ok());
      theirs.push_back(std::move(*e));
    }
    std::vector<std::vector<unsigned char>> src, dst;
    std::vector<Request> reqs;
    for (int i = 0; i < 10; ++i) {
      src.push_back(random_bytes((8 << 20) + i));
      dst.emplace_back(src.back().size());
      reqs.push_back(theirs[i].recv(MemRegion{dst.back().data(), dst.back().size(), {}}, 1));
      reqs.push_back(mine[i].send(MemRegion{src.back().data(), src.back().size(), {}}, 1));
    }
    int busy = process_threads() - before;
    for (auto& r : reqs) ASSERT_TRUE(r.wait(60s).ok());
    for (int i = 0; i < 10; ++i) EXPECT_EQ(src[i], dst[i]) << "endpoint " << i;
    std::printf("scope %s: 10 busy endpoint pairs of 4 streams: %d threads\n", scope, busy);
    EXPECT_LE(busy, allowed) << "10 busy endpoint pairs of 4 streams";
    for (auto& e : mine) EXPECT_TRUE(e.close().ok());
    for (auto& e : theirs) EXPECT_TRUE(e.close().ok());
  }
  int after = process_threads();
  for (auto until = Clock::now() + 5s; Clock::now() < until && after > before; after = process_threads())
    std::this_thread::sleep_for(10ms);
  // One more is the reaper (src/core/reaper.h), started if a thread happened to drop its own owner.
  EXPECT_LE(after, before + 1) << "threads left behind by closed contexts";
}

// Two contexts × (3 workers + closer), the listener, set-up threads still finishing.
TEST(Limits, BusyEndpointsShareTheContextsWorkers) { busy_endpoints_add_few_threads("context", 2 * 4 + 3); }

// 20 endpoints × (1 worker + closer), the listener, set-up threads still finishing.
TEST(Limits, EndpointScopeRunsAnEndpointOnOneThread) { busy_endpoints_add_few_threads("endpoint", 20 * 2 + 3); }

// Two processes of one host agree shm (and the shm pipe): one stream, so an endpoint costs the shm
// path's thread, whatever the streams setting; its stream runs on the context's workers.
TEST(Limits, SameHostEndpointsOpenOneStream) {
  std::thread([] {}).join();
  int before = process_threads();
  Server s = make_server(test_options(8).set("stream_workers", "2"));
  auto client = Context::create(test_options(8).set("stream_workers", "2"));
  std::vector<Endpoint> eps;
  constexpr int kPairs = 8;
  for (int i = 0; i < kPairs; ++i) {
    auto c = client->connect(s.listener.address());
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    if (c->stats().transport != "shm") DMX_SKIP(kNotAgreed) << "shm: " << c->stats().reason;
    EXPECT_EQ(c->stats().streams, 1) << c->stats().reason;
    eps.push_back(std::move(*c));
    auto e = s.listener.accept(10s);
    ASSERT_TRUE(e.ok());
    eps.push_back(std::move(*e));
  }
  int grew = process_threads() - before;
  std::printf("%d same-host endpoint pairs with streams=8: %d threads (%.1f per endpoint)\n", kPairs, grew,
              grew / (2.0 * kPairs));
  // 1 per endpoint, 2 workers and the closer per context, the listener, set-up threads finishing.
  EXPECT_LE(grew, 2 * kPairs + 2 * 3 + 4);
  for (auto& e : eps) EXPECT_TRUE(e.close().ok());
}

}  // namespace
}  // namespace dmx::test
