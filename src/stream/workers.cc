// The worker set (see workers.h).
#include "stream/workers.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/log.h"
#include "core/reaper.h"
#include "core/sys.h"
#include "stream/stream.h"

namespace dmx::stream {
namespace {

thread_local bool t_worker = false;

// How often a worker with active streams also looks at its parked ones (one epoll_wait without
// sleeping): an event waits at most this long while other streams are busy.
constexpr auto kPollEvery = std::chrono::microseconds(20);

uint32_t epoll_events(short poll_events) {
  uint32_t e = EPOLLONESHOT;
  if (poll_events & POLLIN) e |= EPOLLIN;
  if (poll_events & POLLOUT) e |= EPOLLOUT;
  if (poll_events & POLLRDHUP) e |= EPOLLRDHUP;
  return e;
}

// The thread of a worker or of the closer: started by its first stream, ended by quit() once no
// stream is left. The loop reads quitting() without a lock: quit() sets the flag, then wakes the
// loop by the owner's `wake`, which must not be lost if it comes between the loop's look at the
// flag and its sleep; the loop then sees the flag. The flag publishes nothing else, so
// release/acquire is enough.
class LoopThread {
 public:
  // Starts `body` unless started; true when it did. One caller at a time (the owner's mutex).
  template <typename Body>
  bool start(Body&& body) {
    if (thread_.joinable()) return false;
    thread_ = std::thread(std::forward<Body>(body));
    return true;
  }
  bool quitting() const { return quit_.load(std::memory_order_acquire); }  // any thread
  // After the last start: joins the thread here, or by the reaper when this is that thread.
  template <typename Wake>
  void quit(Wake&& wake) {
    quit_.store(true, std::memory_order_release);
    wake();
    join_or_reap(thread_);
  }

 private:
  std::thread thread_;
  std::atomic<bool> quit_{false};
};

}  // namespace

class Closer;

class Worker {
 public:
  Worker(std::string name, Closer* closer) : name_(std::move(name)), closer_(closer) {
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    bell_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;  // the bell
    if (!epoll_.valid() || !bell_.valid() || ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, bell_.get(), &ev) != 0)
      DMX_LOG_ERROR("stream worker {}: no epoll set ({}); its streams will poll", name_, errno_text(errno));
  }

  // Starts the thread on first use. `core` keeps the set's state alive while the thread runs.
  void attach(Stream* s, std::shared_ptr<void> core) {
    streams_.fetch_add(1, std::memory_order_relaxed);
    if (s->slot_.bulk) bulk_.fetch_add(1, std::memory_order_relaxed);
    s->slot_.worker.store(this, std::memory_order_release);
    std::lock_guard<std::mutex> lock(mu_);
    s->slot_.attached = true;
    s->slot_.queued = true;
    ready_.push_back(s);
    has_ready_.store(true, std::memory_order_seq_cst);
    if (!thread_.start([this, core = std::move(core)] { run(core); })) ring();
  }

  void ready(Stream* s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!s->slot_.attached || s->slot_.queued) return;
      s->slot_.queued = true;
      ready_.push_back(s);
      has_ready_.store(true, std::memory_order_seq_cst);
    }
    if (sleeping_.load(std::memory_order_seq_cst)) ring();
  }

  // Ends the thread once it has no streams. A ring the loop has not read keeps the eventfd
  // readable, so its next epoll_pwait2 returns at once: the quit is not lost.
  void quit() {
    thread_.quit([this] { ring(); });
  }

  // Streams on this worker that have not ended, and those of them that carry data: placement
  // (Workers::add) reads them as a hint.
  uint32_t streams() const { return streams_.load(std::memory_order_relaxed); }
  uint32_t bulk() const { return bulk_.load(std::memory_order_relaxed); }

 private:
  void ring() {
    uint64_t one = 1;
    (void)!::write(bell_.get(), &one, sizeof one);
  }
  void run(const std::shared_ptr<void>& core);
  void take_ready();
  void activate(Stream* s);
  void park(Stream* s, const pollfd* fds, int n, Clock::time_point due);
  void detach(Stream* s);
  void wait_events(std::chrono::nanoseconds timeout);

  const std::string name_;
  Closer* const closer_;
  UniqueFd epoll_, bell_;
  LoopThread thread_;  // started under mu_

  std::mutex mu_;  // guards ready_ and the slots' attached/queued
  std::vector<Stream*> ready_;
  std::atomic<bool> has_ready_{false};
  std::atomic<bool> sleeping_{false};

  // The worker thread's own.
  std::vector<Stream*> active_;
  std::vector<Stream*> taken_;  // take_ready's, swapped with ready_
  std::multimap<Clock::time_point, Stream*> timers_;
  size_t attached_ = 0;
  std::atomic<uint32_t> streams_{0}, bulk_{0};  // attach() adds, detach() takes away
};

// Ends streams off the workers: Stream::finish may wait (copies, the endpoint's paths), and the
// host may be destroyed when its last stream lets go of it.
class Closer {
 public:
  explicit Closer(std::string name) : name_(std::move(name)) {}
  void post(Stream* s, std::shared_ptr<void> core) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(s);
    thread_.start([this, core = std::move(core)] { run(); });
    cv_.notify_one();
  }
  // The notify goes under mu_: the closer looks at the flag under it, so the notify cannot fall
  // between its look and its wait.
  void quit() {
    thread_.quit([this] {
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_one();
    });
  }

 private:
  void run() {
    t_worker = true;
    pthread_setname_np(pthread_self(), (name_ + "-end").substr(0, 15).c_str());
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return thread_.quitting() || !queue_.empty(); });
      if (queue_.empty()) return;
      Stream* s = queue_.front();
      queue_.pop_front();
      lock.unlock();
      s->finish();
      std::function<void()> last = std::move(s->slot_.after_exit);
      { std::shared_ptr<void> drop = std::move(s->slot_.keep_alive); }  // may destroy s, even this set
      if (last) last();
      lock.lock();
    }
  }

  const std::string name_;
  std::mutex mu_;  // guards queue_
  std::condition_variable cv_;
  std::deque<Stream*> queue_;
  LoopThread thread_;  // started under mu_
};

struct Workers::Core {
  Core(int n, const std::string& name) : closer(name) {
    for (int i = 0; i < n; ++i) workers.push_back(std::make_unique<Worker>(fmt::format("{}{}", name, i), &closer));
  }
  Closer closer;
  std::vector<std::unique_ptr<Worker>> workers;
  std::atomic<uint64_t> next{0};
};

void Worker::run(const std::shared_ptr<void>& core) {
  t_worker = true;
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  // Sleeps are short and deliberate; the default 50 us timer slack would dominate them.
  ::prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  Clock::time_point last_look = Clock::now();
  for (;;) {
    take_ready();
    if (attached_ == 0 && thread_.quitting()) return;
    for (size_t i = 0; i < active_.size();) {
      Stream* s = active_[i];
      Stream::Turn t = s->turn();
      if (t == Stream::Turn::kAgain) {
        ++i;
        continue;
      }
      if (t == Stream::Turn::kSleep) {
        pollfd fds[3];
        int n = s->sleep_fds(fds);
        if (n < 0) {  // something arrived meanwhile
          ++i;
          continue;
        }
        park(s, fds, n, s->wake_by());
      } else {
        detach(s);
        closer_->post(s, core);
      }
      active_[i] = active_.back();
      active_.pop_back();
    }
    auto now = Clock::now();
    while (!timers_.empty() && timers_.begin()->first <= now) activate(timers_.begin()->second);
    if (!active_.empty()) {
      if (now - last_look >= kPollEvery) {
        wait_events(std::chrono::nanoseconds(0));
        last_look = now;
      }
      continue;
    }
    // Nothing to turn: say so, then look once more for wake-ups posted before the flag was seen.
    sleeping_.store(true, std::memory_order_seq_cst);
    if (has_ready_.load(std::memory_order_seq_cst)) {
      sleeping_.store(false, std::memory_order_relaxed);
      continue;
    }
    auto timeout = timers_.empty() ? std::chrono::nanoseconds(-1)
                                   : std::max(std::chrono::nanoseconds(0),
                                              std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                  timers_.begin()->first - Clock::now()));
    wait_events(timeout);
    sleeping_.store(false, std::memory_order_relaxed);
    last_look = Clock::now();
  }
}

// timeout < 0: until an event.
void Worker::wait_events(std::chrono::nanoseconds timeout) {
  epoll_event evs[64];
  timespec ts{static_cast<time_t>(timeout.count() / 1'000'000'000), static_cast<long>(timeout.count() % 1'000'000'000)};
  int n = ::epoll_pwait2(epoll_.get(), evs, 64, timeout.count() < 0 ? nullptr : &ts, nullptr);
  for (int i = 0; i < n; ++i) {
    if (evs[i].data.ptr == nullptr) {
      uint64_t v;
      (void)!::read(bell_.get(), &v, sizeof v);
      continue;
    }
    activate(static_cast<Stream*>(evs[i].data.ptr));
  }
}

void Worker::take_ready() {
  if (!has_ready_.load(std::memory_order_acquire)) return;
  std::vector<Stream*>& got = taken_;  // both vectors keep their capacity: no allocation per wake-up
  got.clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    got.swap(ready_);
    has_ready_.store(false, std::memory_order_relaxed);
    for (Stream* s : got) s->slot_.queued = false;
  }
  for (Stream* s : got) {
    if (!s->slot_.known) {  // new here
      s->slot_.known = true;
      ++attached_;
      active_.push_back(s);
    } else {
      activate(s);
    }
  }
}

void Worker::activate(Stream* s) {
  WorkerSlot& slot = s->slot_;
  if (!slot.parked) return;  // active already
  timers_.erase(slot.timer);
  slot.parked = false;
  s->woke();
  active_.push_back(s);
}

void Worker::park(Stream* s, const pollfd* fds, int n, Clock::time_point due) {
  WorkerSlot& slot = s->slot_;
  for (int i = 0; i < n; ++i) {
    epoll_event ev{};
    ev.events = epoll_events(fds[i].events);
    ev.data.ptr = s;
    int k = 0;
    while (k < 3 && slot.fds[k] != fds[i].fd && slot.fds[k] >= 0) ++k;
    if (k < 3 && slot.fds[k] == fds[i].fd) {
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fds[i].fd, &ev);
    } else if (k < 3 && ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fds[i].fd, &ev) == 0) {
      slot.fds[k] = fds[i].fd;
    }
  }
  if (!epoll_.valid()) due = std::min(due, Clock::now() + kPollEvery);  // nothing else wakes it
  slot.parked = true;
  slot.timer = timers_.emplace(due, s);
}

void Worker::detach(Stream* s) {
  WorkerSlot& slot = s->slot_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    slot.attached = false;
    if (slot.queued) ready_.erase(std::remove(ready_.begin(), ready_.end(), s), ready_.end());
    slot.queued = false;
  }
  --attached_;
  streams_.fetch_sub(1, std::memory_order_relaxed);
  if (slot.bulk) bulk_.fetch_sub(1, std::memory_order_relaxed);
  for (int& fd : slot.fds) {
    if (fd >= 0) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
    fd = -1;
  }
  if (slot.parked) timers_.erase(slot.timer);
  slot.parked = false;
}

void ready(Worker* w, Stream* s) { w->ready(s); }

Workers::Workers(int threads, std::string name) : core_(std::make_shared<Core>(std::max(1, threads), name)) {}

Workers::~Workers() {
  // No stream is left: each holds its host, which holds this set.
  for (auto& w : core_->workers) w->quit();
  core_->closer.quit();
}

void Workers::add(Stream* s, bool bulk, std::shared_ptr<void> keep_alive, std::function<void()> after_exit) {
  s->slot_.keep_alive = std::move(keep_alive);
  s->slot_.after_exit = std::move(after_exit);
  s->slot_.bulk = bulk;
  // The counts are a hint: endpoints that start at once may both pick the same worker.
  const auto& ws = core_->workers;
  auto rank = [&](const Worker& w) {
    return bulk ? std::pair(w.bulk(), w.streams()) : std::pair(w.streams(), w.bulk());
  };
  size_t from = core_->next.fetch_add(1, std::memory_order_relaxed) % ws.size(), best = from;
  for (size_t k = 1; k < ws.size(); ++k) {
    size_t i = (from + k) % ws.size();
    if (rank(*ws[i]) < rank(*ws[best])) best = i;
  }
  ws[best]->attach(s, core_);
}

bool Workers::on_worker_thread() { return t_worker; }

std::vector<Workers::Load> Workers::loads() const {
  std::vector<Load> out;
  for (const auto& w : core_->workers) out.push_back(Load{w->streams(), w->bulk()});
  return out;
}

}  // namespace dmx::stream
