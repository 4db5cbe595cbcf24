#include "future.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "endpoint.h"
#include "errors.h"
#include "profile.h"

namespace py = pybind11;

namespace dmxpy {

Waker::Waker() {
  fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd_ < 0) raise_error(dmx::Code::kIo, std::string("eventfd() failed: ") + std::strerror(errno));
}

Waker::~Waker() {
  if (fd_ >= 0) ::close(fd_);
}

void Waker::post(uint64_t id) {
  {
    std::lock_guard<std::mutex> l(mu_);
    ready_.push_back(id);
  }
  uint64_t one = 1;
  // EAGAIN only when the counter is near overflow: the loop is awake anyway.
  [[maybe_unused]] ssize_t n = ::write(fd_, &one, sizeof one);
}

std::vector<uint64_t> Waker::drain() {
  uint64_t count;
  [[maybe_unused]] ssize_t n = ::read(fd_, &count, sizeof count);
  std::vector<uint64_t> out;
  std::lock_guard<std::mutex> l(mu_);
  out.swap(ready_);
  return out;
}

void Watch::fire() {
  std::vector<std::pair<std::shared_ptr<Waker>, uint64_t>> to_wake;
  {
    std::lock_guard<std::mutex> l(mu);
    fired = true;
    to_wake.swap(waiters);
  }
  for (auto& [w, id] : to_wake) w->post(id);
}

Future::Future(dmx::Request req, std::shared_ptr<Watch> watch, Keep keep, std::shared_ptr<EndpointState> ep)
    : req_(std::move(req)), watch_(std::move(watch)), keep_(std::move(keep)), ep_(std::move(ep)) {}

Future::~Future() {
  if (!keep_.empty() && ep_) {
    if (req_.test()) keep_.clear();
    else ep_->adopt(req_, std::move(keep_));
  }
}

void Future::finish() {
  if (keep_.empty()) return;
  profile::Timer timer(profile::kRelease);
  keep_.clear();
}

size_t Future::wait(std::optional<double> timeout) {
  profile::Timer timer(profile::kWait);
  dmx::Duration limit = to_duration(timeout, "wait(timeout)");
  if (!req_.test()) {
    bool done = wait_in_slices(limit, [&](dmx::Duration slice) {
      (void)req_.wait(slice);
      return req_.test();
    });
    if (!done)
    {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g", *timeout);
      raise_error(dmx::Code::kTimeout, std::string("wait(timeout=") + secs +
                                           "): the operation is not complete yet; it continues (wait again or cancel)");
    }
  }
  finish();
  dmx::Status st = req_.status();
  check(st);
  return req_.bytes();
}

bool Future::done() {
  if (!req_.test()) return false;
  finish();
  return true;
}

void Future::cancel() {
  py::gil_scoped_release nogil;
  req_.cancel();
}

bool Future::watch(std::shared_ptr<Waker> waker, uint64_t id) {
  std::lock_guard<std::mutex> l(watch_->mu);
  if (watch_->fired) return false;
  watch_->waiters.emplace_back(std::move(waker), id);  // bounded by the awaiters alive
  return true;
}

}  // namespace dmxpy
