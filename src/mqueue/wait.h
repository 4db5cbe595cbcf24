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
    if (++n_ < 256) return;
    if (n_ < 1024) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(n_ < 4096 ? 10 : 100));
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
