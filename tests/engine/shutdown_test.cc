// Shutdown: every dmx thread is joined. After endpoints close the process has the threads it had
// before; a handle dropped on its own worker is joined by the reaper; a process that exits right
// after closing its endpoints leaves no thread running into its exit.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "core/reaper.h"
#include "proc_threads.h"
#include "engine/exit_helper_path.h"
#include "engine/test_util.h"

extern char** environ;

namespace dmx::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

void one_message(Endpoint& from, Endpoint& to, size_t n) {
  Filled src = filled(MemSpec{}, n);
  Buffer dst = poisoned(MemSpec{}, n);
  Request r = to.recv(dst.region(), 9);
  Request s = from.send(src.buf.region(), 9);
  ASSERT_TRUE(s.wait(30s).ok()) << s.status().to_string();
  ASSERT_TRUE(r.wait(30s).ok()) << r.status().to_string();
  ASSERT_EQ(read_back(dst.region()), src.data);
}

class Shutdown : public ::testing::TestWithParam<const char*> {};

// Checked right after close, with no grace period: a worker that were detached, or still running
// when close() returned, would show here.
TEST_P(Shutdown, ThreadCountReturnsToTheStartAfterEndpointsClose) {
  Options o = test_options(3);
  o.set("transport", GetParam());
  o.set("stream_workers", "1");  // started by the first pair
  Pair p = connect_pair(o);
  // Lazily made threads of the context (copy workers; shm's copy crew, which a 3 MiB message
  // starts) exist from here.
  one_message(p.client, p.server, 3 << 20);
  EXPECT_TRUE(p.client.close().ok());
  EXPECT_TRUE(p.server.close().ok());
  p.client = Endpoint();
  p.server = Endpoint();
  // Threads named "dmx-…": stream workers and their closer, path threads, the copy crew, the
  // reaper. Not the listener's set-up threads, which the listener joins when it next wakes (after
  // accept returned).
  const int start = process_threads("dmx-");
  for (int i = 0; i < 12; ++i) {
    auto c = p.ctx.connect(p.listener.address());
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    auto s = p.listener.accept(10s);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    one_message(*c, *s, i % 2 ? 100 : 3 << 20);
    // Streams run on the context's workers; a payload path (auto: shm) has a thread of its own,
    // which names itself once it runs: a 100-byte message goes inline, without waiting for it.
    if (std::string(GetParam()) != "tcp") {
      auto until = std::chrono::steady_clock::now() + 5s;
      while (process_threads("dmx-") <= start && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(1ms);
      EXPECT_GT(process_threads("dmx-"), start);
    }
    // Either side closes first, or the handles just go.
    if (i % 3 == 0) {
      EXPECT_TRUE(c->close().ok());
    } else if (i % 3 == 1) {
      EXPECT_TRUE(s->close().ok());
    }
  }
  EXPECT_EQ(process_threads("dmx-"), start);
  EXPECT_EQ(reaper_pending(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Transports, Shutdown, ::testing::Values("tcp", "auto"));

// A completion callback destroys its endpoint's last handle: close() cannot wait on its own
// worker, so the endpoint dies on its last worker, which the reaper then joins.
TEST(ShutdownReaper, HandleDroppedInItsOwnCallbackIsJoined) {
  Pair p = connect_pair(test_options(2));
  one_message(p.client, p.server, 100);
  const int start = process_threads();
  auto server = std::make_shared<Endpoint>(std::move(p.server));
  Filled src = filled(MemSpec{}, 1000);
  Buffer dst = poisoned(MemSpec{}, 1000);
  std::atomic<bool> dropped{false};
  OpOptions o;
  o.on_complete = [server, &dropped](const Status&, size_t) {
    Endpoint gone = std::move(*server);
    dropped = true;
  };
  Request r = server->recv(dst.region(), 1, o);
  server.reset();  // the callback holds the only handle
  Request s = p.client.send(src.buf.region(), 1);
  ASSERT_TRUE(r.wait(30s).ok()) << r.status().to_string();
  ASSERT_TRUE(dropped);
  EXPECT_TRUE(p.client.close().ok());
  // The server's workers end (the client closed) and are joined; the reaper thread remains.
  // Settled for 50 ms, not for one look: the client's own workers leave the count meanwhile, so a
  // single look could pass while a server worker is still on its way to the reaper (and would then
  // race the process's exit).
  auto until = Clock::now() + 20s;
  int calm = 0;
  while (calm < 50 && Clock::now() < until) {
    calm = reaper_pending() == 0 && process_threads() <= start + 1 ? calm + 1 : 0;
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(reaper_pending(), 0u);
  EXPECT_LE(process_threads(), start + 1);
}

// Under ThreadSanitizer a race with the exit makes the helper exit with 66.
TEST(ShutdownExit, ProcessExitsCleanlyRightAfterClose) {
  const char* helper = DMX_EXIT_HELPER_PATH;
  char* argv[] = {const_cast<char*>(helper), nullptr};
  pid_t pid = -1;
  ASSERT_EQ(::posix_spawn(&pid, helper, nullptr, nullptr, argv, environ), 0) << helper;
  int status = 0;
  auto until = Clock::now() + 120s;
  pid_t got = 0;
  while ((got = ::waitpid(pid, &status, WNOHANG)) == 0 && Clock::now() < until) std::this_thread::sleep_for(10ms);
  if (got == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "the helper did not exit within 120 s";
  }
  ASSERT_TRUE(WIFEXITED(status)) << "signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace dmx::test
