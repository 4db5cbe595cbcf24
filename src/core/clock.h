// Deadlines: every blocking wait in dmx takes one.
#pragma once

#include <chrono>

namespace dmx {

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  Deadline() : at_(Clock::time_point::max()) {}  // never
  static Deadline never() { return Deadline(); }
  static Deadline after(std::chrono::nanoseconds d) {
    Deadline x;
    x.at_ = d.count() <= 0 ? Clock::now() : Clock::now() + d;
    return x;
  }
  static Deadline at(Clock::time_point t) {
    Deadline x;
    x.at_ = t;
    return x;
  }
  bool is_never() const { return at_ == Clock::time_point::max(); }
  bool expired() const { return !is_never() && Clock::now() >= at_; }
  Clock::time_point time() const { return at_; }
  // Milliseconds left for poll(2): -1 for never, 0 when expired.
  int poll_timeout_ms() const;
  Deadline earlier(const Deadline& o) const { return o.at_ < at_ ? o : *this; }

 private:
  Clock::time_point at_;
};

inline int Deadline::poll_timeout_ms() const {
  if (is_never()) return -1;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 1'000'000 ? 1'000'000 : static_cast<int>(left) + 1;
}

}  // namespace dmx
