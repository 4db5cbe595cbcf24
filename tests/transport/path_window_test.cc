// The endpoint keeps as many chunks posted on a payload path as the path's window() says (the loop
// transport, whose window and chunk size a test sets, holding its chunks so that the window
// fills); and the shm path's window covers two rings' worth of chunks.
#include <gtest/gtest.h>

#include <thread>

#include "engine/test_util.h"
#include "transport/conformance.h"
#include "transport/loop_transport.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;

uint64_t chunks_posted(const Endpoint& ep) {
  auto paths = ep.stats().paths;
  return paths.empty() ? 0 : paths[0].chunks_sent;  // the loop path counts its post_tx calls
}

class PathWindow : public ::testing::TestWithParam<size_t> {};

TEST_P(PathWindow, SenderKeepsThePathsWindowPosted) {
  const size_t window = GetParam();
  constexpr uint64_t kChunk = 64 << 10;
  LoopKnobs knobs(window, kChunk);
  knobs.hold(true);
  const Harness* h = nullptr;
  for (const Harness& x : harnesses())
    if (x.name == "loop") h = &x;
  ASSERT_NE(h, nullptr);
  auto sc = h->make_context(0, test_options(1));
  auto cc = h->make_context(1, test_options(1));
  ASSERT_TRUE(sc.ok() && cc.ok());
  auto l = sc->listen("tcp://127.0.0.1:0");
  ASSERT_TRUE(l.ok());
  auto c = cc->connect(l->address());
  auto s = l->accept(10s);
  ASSERT_TRUE(c.ok() && s.ok());
  ASSERT_EQ(c->stats().transport, "loop");

  const size_t n = 20 * kChunk + 13;  // more chunks than any window here
  Filled src = filled(MemSpec{}, n);
  Buffer dst = poisoned(MemSpec{}, n);
  Request r = s->recv(dst.region(), 1);
  Request q = c->send(src.buf.region(), 1);
  auto until = std::chrono::steady_clock::now() + 10s;
  while (chunks_posted(*c) < window && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(100ms);  // time to post more, were the window larger
  EXPECT_EQ(chunks_posted(*c), window);

  knobs.hold(false);
  ASSERT_TRUE(q.wait(30s).ok());
  ASSERT_TRUE(r.wait(30s).ok());
  EXPECT_EQ(read_back(dst.region()), src.data);
  EXPECT_EQ(chunks_posted(*c), 21u);
}

// Below and above the default of 8.
INSTANTIATE_TEST_SUITE_P(Windows, PathWindow, ::testing::Values(size_t{3}, size_t{12}));

}  // namespace
}  // namespace dmx::test
