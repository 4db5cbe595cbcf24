// The reaper (core/reaper.h): a thread that drops the last reference to its own owner is joined
// by the reaper, not detached; a thread joined by another is joined at once.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <future>
#include <memory>
#include <thread>

#include "core/reaper.h"
#include "proc_threads.h"

namespace dmx {
namespace {

using namespace std::chrono_literals;

// Threads of this process now. The first thread a process makes can start runtime helpers (the
// ThreadSanitizer background thread): make and join one before taking a baseline.
int baseline() {
  std::thread([] {}).join();
  return process_threads();
}

// Owns a thread; the thread destroys its owner as its last step, as a stream worker that drops
// its endpoint's last reference does.
struct Owner {
  std::thread thread;
  ~Owner() { join_or_reap(thread); }
};

TEST(Reaper, ThreadThatDestroysItsOwnerIsJoinedByTheReaper) {
  const int start = baseline();
  for (int i = 0; i < 20; ++i) {
    auto* owner = new Owner;
    std::promise<void> assigned;
    std::shared_future<void> ready = assigned.get_future().share();
    owner->thread = std::thread([owner, ready] {
      ready.wait();
      delete owner;  // on its own thread: join_or_reap hands it to the reaper
    });
    assigned.set_value();
  }
  // Every thread is joined: only the reaper itself remains beyond the start.
  // Settled means settled for a while: between a thread handing itself over and the reaper
  // joining it, a single look can see neither (seen under TSan on a loaded machine).
  auto until = std::chrono::steady_clock::now() + 10s;
  int calm = 0;
  while (calm < 50 && std::chrono::steady_clock::now() < until) {
    calm = reaper_pending() == 0 && process_threads() <= start + 1 ? calm + 1 : 0;
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(reaper_pending(), 0u);
  EXPECT_EQ(process_threads(), start + 1);
}

TEST(Reaper, AnotherThreadJoinsAtOnce) {
  const int start = baseline();
  std::atomic<bool> ran{false};
  std::thread t([&] { ran = true; });
  join_or_reap(t);
  EXPECT_FALSE(t.joinable());
  EXPECT_TRUE(ran);
  EXPECT_EQ(process_threads(), start);  // joined here, not handed on
  EXPECT_EQ(reaper_pending(), 0u);
}

// A thread that finishes while the process is already exiting, after the reaper's shutdown (an
// endpoint's last thread ending as main returns), hands itself over and the process still exits
// cleanly: it is detached, not queued where nothing joins it (std::terminate at exit, seen once
// in the README's suite). The child is this binary again, so that its atexit handler is registered
// before the reaper's first use and so runs after the reaper's shutdown.
std::atomic<bool> g_go{false}, g_done{false};
std::thread* g_first = nullptr;  // globals: still reachable at exit, no leak for LeakSanitizer
std::thread* g_late = nullptr;

void after_the_reapers_shutdown() {
  g_go = true;
  for (int i = 0; i < 10000 && !g_done; ++i) std::this_thread::sleep_for(1ms);
  std::printf("late thread %s\n", g_done ? "handed over" : "stuck");
  std::fflush(stdout);
}

TEST(Reaper, DISABLED_ChildHandsAThreadOverDuringExit) {
  if (std::getenv("DMX_REAPER_EXIT_CHILD") == nullptr) GTEST_SKIP() << "run by ThreadFinishingDuringExitIsDetached";
  std::atexit(after_the_reapers_shutdown);
  std::thread early([] {});
  static std::atomic<bool> assigned{false};
  static std::atomic<bool> handed{false};
  g_first = new std::thread;
  *g_first = std::thread([] {  // the reaper's first use: it starts
    while (!assigned) std::this_thread::sleep_for(1ms);
    join_or_reap(*g_first);
    handed = true;
  });
  assigned = true;
  join_or_reap(early);
  // The first use must come before main returns: made during exit, the reaper's shutdown would
  // run after this handler, and the logger it builds would be built while spdlog's statics die
  // (a crash seen under ASan on a loaded machine).
  for (int i = 0; i < 10000 && !handed; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(handed);
  g_late = new std::thread([] {
    while (!g_go) std::this_thread::sleep_for(1ms);
    join_or_reap(*g_late);  // after the shutdown
    g_done = true;
  });
}

TEST(Reaper, ThreadFinishingDuringExitIsDetached) {
  std::string cmd = "DMX_REAPER_EXIT_CHILD=1 /proc/" + std::to_string(::getpid()) +
                    "/exe --gtest_also_run_disabled_tests --gtest_filter=Reaper.DISABLED_ChildHandsAThreadOverDuringExit "
                    "2>&1";
  FILE* f = ::popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f) != nullptr) out += buf;
  int st = ::pclose(f);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st << ":\n" << out;
  EXPECT_NE(out.find("late thread handed over"), std::string::npos) << out;
}

}  // namespace
}  // namespace dmx
