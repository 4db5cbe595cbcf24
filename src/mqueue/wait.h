// mqueue/wait.h — polling with a deadline and back-off, for CPU workers and clients.
//
// Spins briefly (a reply often comes within microseconds), then yields, then sleeps in short
// steps so that idle pollers leave the core to others; every wait ends at its deadline or when
// `stop` is set.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

namespace dmx::mqueue {

class Backoff {
 public:
  void pause() {
    ++n_;
    if (n_ < 64) return;
    // Yielding, not sleeping: on a machine with fewer cores than pollers a sleep of even 10 us
    // becomes the latency of every request; a yield hands the core over only when someone waits.
    if (n_ < (1u << 16)) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));  // idle for long: leave the core
  }
  void reset() { n_ = 0; }

 private:
  unsigned n_ = 0;
};

enum class WaitEnd { kReady, kStopped, kTimeout };

// Polls ready() until true, `stop` is set or `deadline` passes.
template <typename Ready>
WaitEnd wait_until(Ready&& ready, const std::atomic<bool>& stop, std::chrono::steady_clock::time_point deadline) {
  Backoff b;
  for (unsigned i = 0;; ++i) {
    if (ready()) return WaitEnd::kReady;
    if (stop.load(std::memory_order_relaxed)) return WaitEnd::kStopped;
    if ((i & 63) == 0 && std::chrono::steady_clock::now() >= deadline) return WaitEnd::kTimeout;
    b.pause();
  }
}

}  // namespace dmx::mqueue
