// The shared machinery of the payload paths: see path_base.h.
#include "transport/path_base.h"

#include <fmt/format.h>
#include <pthread.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>

#include "core/clock.h"
#include "core/log.h"
#include "core/reaper.h"

namespace dmx {

PathStats PathCounters::load() const {
  PathStats s;
  s.chunks_sent = chunks_sent.load(std::memory_order_relaxed);
  s.chunks_received = chunks_received.load(std::memory_order_relaxed);
  s.bytes_sent = bytes_sent.load(std::memory_order_relaxed);
  s.bytes_received = bytes_received.load(std::memory_order_relaxed);
  s.host_copies = host_copies.load(std::memory_order_relaxed);
  s.device_copies = device_copies.load(std::memory_order_relaxed);
  s.wakeups = wakeups.load(std::memory_order_relaxed);
  s.inline_copies = inline_copies.load(std::memory_order_relaxed);
  return s;
}

void PathCounters::set(const PathStats& s) {
  chunks_sent.store(s.chunks_sent, std::memory_order_relaxed);
  chunks_received.store(s.chunks_received, std::memory_order_relaxed);
  bytes_sent.store(s.bytes_sent, std::memory_order_relaxed);
  bytes_received.store(s.bytes_received, std::memory_order_relaxed);
  host_copies.store(s.host_copies, std::memory_order_relaxed);
  device_copies.store(s.device_copies, std::memory_order_relaxed);
  inline_copies.store(s.inline_copies, std::memory_order_relaxed);
}

PathBase::PathBase(Options o) : options_(std::move(o)), wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  // Without its eventfd the path cannot sleep: it is failed from the start (posts are refused,
  // start() reports on_path_failed and stops).
  if (!wake_.valid()) {
    failure_ = errno_status(fmt::format("eventfd({} path)", options_.thread_name), errno);
    closed_why_ = failure_;
    failed_.store(true, std::memory_order_relaxed);
  }
}

PathBase::~PathBase() {
  assert((!thread_.joinable() || thread_.get_id() == std::this_thread::get_id()) &&
         "a derived path's destructor calls end_thread() first");
}

void PathBase::start(Events* events, std::shared_ptr<void> keep_alive) {
  std::lock_guard lk(thread_mu_);
  assert(events != nullptr && !started_ && "start() is called once");
  if (started_) return;
  started_ = true;
  events_ = events;
  thread_ = std::thread([this, keep = std::move(keep_alive)]() mutable { run(std::move(keep)); });
  thread_id_.store(thread_.get_id(), std::memory_order_release);
}

void PathBase::stop() {
  {
    std::lock_guard lk(post_mu_);
    stop_requested_.store(true, std::memory_order_release);
    if (closed_why_.ok()) closed_why_ = options_.stopped;
  }
  ring_wake();
  quiesce();
}

void PathBase::quiesce() {
  if (thread_id_.load(std::memory_order_acquire) == std::this_thread::get_id()) return;
  std::lock_guard lk(thread_mu_);
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void PathBase::end_thread() {
  stop();
  std::lock_guard lk(thread_mu_);
  // Still joinable only when the last owner let go on the path's own thread (keep_alive dropped
  // after on_path_stopped): that thread is past its last use of *this, and the reaper joins it.
  join_or_reap(thread_);
}

void PathBase::poke() {
  bool ring = false;
  {
    std::lock_guard lk(post_mu_);
    posted_.store(true, std::memory_order_release);
    ring = std::exchange(sleeping_, false);
  }
  if (ring) ring_wake();
}

void PathBase::ring_wake() {
  uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof one);
}

void PathBase::fail(Status why) {
  bool ring = false;
  {
    std::lock_guard lk(post_mu_);
    if (!failure_.ok() || stop_requested_.load(std::memory_order_relaxed)) return;
    failure_ = std::move(why);
    closed_why_ = failure_;
    failed_.store(true, std::memory_order_release);
    ring = std::exchange(sleeping_, false);
  }
  if (ring) ring_wake();
}

bool PathBase::sleep_on(std::span<pollfd> fds, std::optional<std::chrono::microseconds> timeout) {
  {
    std::lock_guard lk(post_mu_);
    if (posted_.load(std::memory_order_relaxed) || stop_requested_.load(std::memory_order_relaxed) ||
        failed_.load(std::memory_order_relaxed))
      return false;
    sleeping_ = true;
  }
  pollfd all[4] = {{wake_.get(), POLLIN, 0}};
  assert(fds.size() < 4);
  std::copy(fds.begin(), fds.end(), all + 1);
  timespec ts{};
  if (timeout) {
    ts.tv_sec = timeout->count() / 1000000;
    ts.tv_nsec = (timeout->count() % 1000000) * 1000;
  }
  int n = ::ppoll(all, 1 + fds.size(), timeout ? &ts : nullptr, nullptr);
  int err = errno;
  {
    std::lock_guard lk(post_mu_);
    sleeping_ = false;
  }
  uint64_t drained;  // only when rung: a timeout or a socket's wake-up costs no read
  if (n > 0 && (all[0].revents & POLLIN)) (void)!::read(wake_.get(), &drained, sizeof drained);
  for (size_t i = 0; i < fds.size(); ++i) fds[i].revents = n > 0 ? all[i + 1].revents : 0;
  if (n < 0 && err != EINTR) {
    Status s = errno_status(fmt::format("ppoll({} path)", options_.thread_name), err);
    DMX_LOG_WARN("{}", s.to_string());
    fail(std::move(s));
  }
  if (n <= 0) return false;
  if (!stopping()) PathCounters::add(counters_.wakeups);
  return true;
}

void PathBase::run(std::shared_ptr<void> keep_alive) {
  pthread_setname_np(pthread_self(), options_.thread_name);
  std::vector<Done> done;
  auto last_activity = Clock::now();
  while (!stopping() && !failed()) {
    bool moved = progress(&done);
    if (failed()) break;  // this round's completions go around on_path_failed (finish)
    if (!done.empty()) {
      deliver(&done);
      moved = true;
    }
    if (moved) {
      last_activity = Clock::now();
    } else if (Clock::now() - last_activity < options_.spin) {
      cpu_relax();
    } else if (idle()) {
      last_activity = Clock::now();
    }
  }
  finish(&done);
  keep_alive.reset();  // may destroy this path (its destructor then reaps us): touch nothing after
}

// The end: what completed first, then on_path_failed (a failure, not a stop), then every chunk
// that failed or was still pending, then on_path_stopped.
void PathBase::finish(std::vector<Done>* done) {
  Status why;
  bool failure;
  {
    std::lock_guard lk(post_mu_);
    if (closed_why_.ok()) closed_why_ = options_.stopped;  // the gate closes before release takes the queue
    failure = !failure_.ok();
    why = failure ? failure_ : options_.stopped;
  }
  release(why, done);
  auto first_error = std::stable_partition(done->begin(), done->end(), [](const Done& d) { return d.status.ok(); });
  std::vector<Done> errors(std::make_move_iterator(first_error), std::make_move_iterator(done->end()));
  done->erase(first_error, done->end());
  deliver(done);
  if (failure) events_->on_path_failed(why);
  deliver(&errors);
  events_->on_path_stopped();
}

void PathBase::deliver(std::vector<Done>* done) {
  for (Done& d : *done) {
    if (d.tx)
      events_->on_path_tx_done(d.seq, d.status);
    else
      events_->on_path_rx_done(d.seq, d.status);
  }
  done->clear();
}

}  // namespace dmx
