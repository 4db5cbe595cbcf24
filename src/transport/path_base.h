// The machinery every payload path shares (path.h), written once: the progress thread and its
// life cycle (start, stop, keep_alive, join or reap), the post gate and the wake-up (one eventfd
// and a sleeping flag), sticky failure, the order of the last events, and the PathStats counters.
// A path derives from PathBase and writes only its transport's steps: progress() (one round of
// work), idle() (how it sleeps), release() (let go of user memory and hand back what is pending)
// and, when stop() must not wait for the thread, quiesce().
//
// The thread: progress() until the path stops or fails; completions of a round are delivered after
// it, with no path lock held. When nothing moved for `spin`, idle(); what woke it starts a new spin.
// The end (stop() or fail()): release(why) appends every pending chunk with `why`; then the
// completions that succeeded, on_path_failed (a failure only), the failed ones, on_path_stopped,
// and last keep_alive is dropped (which may destroy the path on its own thread: the reaper joins it).
//
// Locks: the post lock (posts, sleeping flag, failure) is the innermost of every path's locks and
// is never held while calling a hook or Events. A derived destructor calls end_thread() first.
#pragma once

#include <poll.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "core/sys.h"
#include "transport/path.h"

namespace dmx {

// PathStats as atomics: the path's threads count, stats() reads.
struct PathCounters {
  std::atomic<uint64_t> chunks_sent{0}, chunks_received{0}, bytes_sent{0}, bytes_received{0}, host_copies{0},
      device_copies{0}, wakeups{0}, inline_copies{0};
  PathStats load() const;
  // Every counter but wakeups (the base counts those) from a snapshot.
  void set(const PathStats& s);
  static void add(std::atomic<uint64_t>& c, uint64_t n = 1) { c.fetch_add(n, std::memory_order_relaxed); }
};

class PathBase : public PayloadPath {
 public:
  struct Options {
    const char* thread_name;            // pthread_setname_np: at most 15 characters
    std::chrono::microseconds spin{0};  // polling after the last activity before idle()
    Status stopped;                     // what posts after stop() return, and what pending chunks complete with
  };

  ~PathBase() override;

  void start(Events* events, std::shared_ptr<void> keep_alive) final;
  // Closes the post gate, wakes the thread, then quiesce(). Idempotent; any thread but the path's
  // own (from it, as from an event callback, it returns without waiting when quiesce() joins).
  void stop() final;
  PathStats stats() const final { return counters_.load(); }

 protected:
  // A completion of a round; tx: on_path_tx_done, else on_path_rx_done.
  struct Done {
    bool tx;
    uint64_t seq;
    Status status;
  };

  explicit PathBase(Options o);

  // ---- hooks, on the path's thread ----
  // One round: takes posts (take_posts), moves bytes, appends completions. Whether anything
  // moved (restarts the spin). May fail() the path; the thread then ends after the round.
  virtual bool progress(std::vector<Done>* done) = 0;
  // Nothing moved for `spin`: sleep (sleep_on) until something may have. True: something woke
  // it. Default: sleep until a post or stop().
  virtual bool idle() { return sleep_on({}, std::nullopt); }
  // The end: stop touching user memory (bounded waits) and append every chunk still pending —
  // posted or in progress — with `why` (the failure, or Options::stopped).
  virtual void release(const Status& why, std::vector<Done>* done) = 0;
  // stop()'s wait, after the gate closed and the thread was woken: when it returns, no user memory
  // is touched. Default: join the thread (not from the thread itself).
  virtual void quiesce();

  // ---- for the derived path ----
  // First in the derived destructor: stop() and join the thread (or hand it to the reaper).
  void end_thread();
  // Runs `push` (which queues a post into the derived path's queue) under the post lock and wakes
  // the thread; refused with the failure or Options::stopped once the gate closed.
  template <class F>
  Status post(F&& push) {
    bool ring = false;
    {
      std::lock_guard lk(post_mu_);
      if (!closed_why_.ok()) return closed_why_;
      push();
      posted_.store(true, std::memory_order_release);
      ring = std::exchange(sleeping_, false);
    }
    if (ring) ring_wake();
    return Status();
  }
  // When something was posted (or poke()d) since the last call: runs `take` under the post lock.
  template <class F>
  bool take_posts(F&& take) {
    if (!posted_.load(std::memory_order_acquire)) return false;
    std::lock_guard lk(post_mu_);
    posted_.store(false, std::memory_order_relaxed);
    take();
    return true;
  }
  // Ok while the gate is open; else why it closed: the failure, or Options::stopped.
  Status gate() const {
    std::lock_guard lk(post_mu_);
    return closed_why_;
  }
  // `f()` under the post lock, and the gate still open.
  template <class F>
  bool open_and(F&& f) const {
    std::lock_guard lk(post_mu_);
    return closed_why_.ok() && f();
  }
  // Makes the thread run a round now (a sleeping thread wakes).
  void poke();
  // Sleeps on the wake-up eventfd and `fds` (revents filled in) for at most `timeout` (nullopt:
  // no bound); returns at once when something was posted or the path stops or failed. True: an fd
  // woke it.
  // A failing ppoll fails the path.
  bool sleep_on(std::span<pollfd> fds, std::optional<std::chrono::microseconds> timeout);
  // The path is broken for good: posts are refused with `why`, the thread ends after this round
  // (woken if it sleeps). The first reason wins; after stop() it is ignored. Logging is the
  // caller's (it knows why).
  void fail(Status why);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  bool stopping() const { return stop_requested_.load(std::memory_order_acquire); }

  PathCounters counters_;

 private:
  void run(std::shared_ptr<void> keep_alive);
  void finish(std::vector<Done>* done);
  void deliver(std::vector<Done>* done);
  void ring_wake();

  const Options options_;
  const UniqueFd wake_;       // eventfd: posters, poke() and stop() ring it while the thread sleeps
  Events* events_ = nullptr;  // set by start(), before the thread exists

  std::mutex thread_mu_;  // guards thread_, started_
  std::thread thread_;
  bool started_ = false;
  // thread_'s id, read without thread_mu_: the path's own thread must not wait for that lock
  // while another thread holds it to join this very thread (quiesce).
  std::atomic<std::thread::id> thread_id_{};

  // Read without the post lock by the thread's loop (the spin takes no lock while nothing is posted).
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> failed_{false};
  std::atomic<bool> posted_{false};  // a post or poke since take_posts: a spinning thread looks
  mutable std::mutex post_mu_;       // guards the derived queues (post, take_posts) and below
  bool sleeping_ = false;            // the thread sleeps (or is about to): ring wake_
  Status closed_why_;                // not ok: the gate is closed (failure or stop)
  Status failure_;
};

}  // namespace dmx
