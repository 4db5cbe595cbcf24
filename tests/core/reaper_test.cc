// The reaper (core/reaper.h): a thread that drops the last reference to its own owner is joined
// by the reaper, not detached; a thread joined by another is joined at once.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
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

}  // namespace
}  // namespace dmx
