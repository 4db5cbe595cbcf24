// python/src/profile.h — per-stage timing of the binding's calls (bench/python_overhead.py --profile).
//
// Off by default; then a stage costs one predictable branch. dmx._dmx._profile(True) clears the
// counters and turns timing on; _profile_take() returns {stage: (calls, seconds)}. The counters are
// touched only with the GIL held (a stage that releases the GIL is timed around the release).
#pragma once

#include <chrono>
#include <cstdint>

namespace dmxpy::profile {

// acquire: a Python object's memory found (buffer protocol, torch attributes, DLPack); post: the
// dmx call, GIL release and re-acquire included; future: the Future and its completion watch;
// wait: Future.wait() (blocked time included); release: the buffers let go after completion;
// list: a vectored call's entries read from its arrays and checked.
enum Stage : int { kAcquire, kPost, kFuture, kWait, kRelease, kList, kStages };
inline constexpr const char* kStageNames[kStages] = {"acquire", "post", "future", "wait", "release", "list"};

struct Counter {
  uint64_t calls = 0;
  uint64_t ns = 0;
};
inline bool enabled = false;
inline Counter counters[kStages];

// Times its scope into `stage` when profiling is on. `count_call` false: adds the time only (a
// stage timed in two pieces counts one call).
class Timer {
 public:
  explicit Timer(Stage stage, bool count_call = true) : stage_(stage), count_(count_call) {
    if (enabled) [[unlikely]]
      start_ = std::chrono::steady_clock::now();
  }
  ~Timer() {
    if (enabled && start_.time_since_epoch().count() != 0) [[unlikely]] {
      auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_);
      counters[stage_].calls += count_ ? 1 : 0;
      counters[stage_].ns += static_cast<uint64_t>(ns.count());
    }
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

 private:
  Stage stage_;
  bool count_;
  std::chrono::steady_clock::time_point start_{};
};

}  // namespace dmxpy::profile
