// The reaper (see reaper.h): one thread that joins threads whose owner died on them.
#include "core/reaper.h"

#include <pthread.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>

#include "core/log.h"

namespace dmx {
namespace {

class Reaper {
 public:
  Reaper() {
    // The logger must outlive the reaper (statics die in reverse order of construction): a thread
    // the reaper joins at exit may still log.
    (void)logger();
  }
  // At static destruction (ShutdownAtExit): joins every thread handed over so far, then its own.
  void shutdown() {
    {
      std::lock_guard lock(mu_);
      quit_ = true;  // a thread handed over from now on is detached (adopt)
      if (pid_ != ::getpid()) {  // never used, or a forked child: those threads are not ours
        forget_locked();
        return;
      }
    }
    cv_.notify_all();
    if (thread_) thread_->join();  // run() joins everything handed over first
  }

  void adopt(std::thread t) {
    {
      std::lock_guard lock(mu_);
      if (quit_) {
        // The process is exiting and the reaper has stopped: a dmx thread that finishes now (an
        // endpoint closed just before main returned) cannot be joined by anyone, and a handle
        // left joinable would end the process in std::terminate. The process ends it.
        t.detach();
        return;
      }
      if (pid_ != ::getpid()) {  // first use, or first use in a forked child (no reaper thread here)
        forget_locked();
        pid_ = ::getpid();
        thread_ = std::make_unique<std::thread>([this] { run(); });
      }
      queue_.push_back(std::make_unique<std::thread>(std::move(t)));
      ++pending_;
    }
    cv_.notify_all();
  }
  size_t pending() {
    std::lock_guard lock(mu_);
    return pending_;
  }

 private:
  void run() {
    pthread_setname_np(pthread_self(), "dmx-reaper");
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return quit_ || !queue_.empty(); });
      if (queue_.empty()) return;  // quit_ and nothing left
      std::unique_ptr<std::thread> t = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      t->join();  // the thread is in its last steps (reaper.h)
      lock.lock();
      --pending_;
    }
  }

  // After fork() the child has copies of the parent's thread handles but none of its threads:
  // joining or destroying a joinable handle would be undefined, so they are let go unused.
  void forget_locked() {
    (void)thread_.release();
    for (auto& t : queue_) (void)t.release();
    queue_.clear();
    pending_ = 0;
  }

  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  pid_t pid_ = 0;  // the process whose reaper thread_ is
  std::deque<std::unique_ptr<std::thread>> queue_;
  size_t pending_ = 0;
  bool quit_ = false;
  std::unique_ptr<std::thread> thread_;
};

// Never destroyed, so that a thread may still hand itself over after the shutdown (it is then
// detached); the shutdown runs at static destruction, before the logger's (Reaper's constructor).
Reaper& reaper() {
  static Reaper* r = new Reaper;
  struct ShutdownAtExit {
    Reaper* r;
    ~ShutdownAtExit() { r->shutdown(); }
  };
  static ShutdownAtExit at_exit{r};
  return *r;
}

}  // namespace

void join_or_reap(std::thread& t) {
  if (!t.joinable()) return;
  if (t.get_id() == std::this_thread::get_id())
    reaper().adopt(std::move(t));
  else
    t.join();
}

size_t reaper_pending() { return reaper().pending(); }

}  // namespace dmx
