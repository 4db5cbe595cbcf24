// The host side of a DeviceHandle (dmx/device_handle.h, docs/gpu-push.md): takes the descriptors a
// kernel published, posts their operations, and reports completions, failures and notifications
// in the control words the kernel reads.
//
// CUDA-free: the ring and control block are any memory both sides reach (mapped pinned memory for
// a GPU; ordinary memory in the CPU tests, where a host thread plays the kernel).
//
// Thread-safety: poll() runs on one thread at a time (the channel's own after start());
// complete paths (the Poster's callbacks), notify() and fail() from any thread. A descriptor is
// taken only while fewer than `slots` operations are outstanding, so at most `slots` are ever in
// flight. Lifetime: the Poster's callbacks may outlive the channel (they hold its shared state and
// write nothing once it is destroyed); the ring and control memory must outlive the channel. The
// channel may be destroyed on its own thread (from within the Poster): the thread then ends
// without touching the ring again and is joined by the reaper (core/reaper.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dmx/device_handle.h"
#include "dmx/status.h"

namespace dmx::device {

// What the channel posts on: the endpoint, or a test double.
class Poster {
 public:
  virtual ~Poster() = default;
  // Posts the descriptor's operation (already checked); `done` runs exactly once, on any thread,
  // with its outcome.
  virtual void post(const DeviceDescriptor& d, std::function<void(const Status&)> done) = 0;
  // Ok while the endpoint can still complete operations; otherwise why not.
  virtual Status health() = 0;
};

class Channel {
 public:
  struct Options {
    // After activity the thread polls without sleeping this long (a kernel's next post costs no
    // wake-up); then it naps 20 us at a time.
    std::chrono::microseconds spin{1000};
    // How often the thread asks the Poster for the endpoint's health.
    std::chrono::microseconds health_every{1000};
    std::string peer;  // for messages
  };
  // `ring` (`slots`, a power of two) and `control` are the handle's memory as the host reaches it;
  // both are zeroed here (failed_ticket: none).
  Channel(DeviceDescriptor* ring, uint32_t slots, DeviceControl* control, std::shared_ptr<Poster> poster,
          Options options);
  ~Channel();  // stop(kClosed)
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Starts the polling thread.
  void start();
  // Takes every published descriptor it may, posts it; returns how many.
  size_t poll();
  // Fails the channel: every outstanding and later ticket fails with `why` (its code goes into
  // the error word). Idempotent: the first failure stays.
  void fail(const Status& why);
  // Fails with `why` and joins the thread. Idempotent.
  void stop(const Status& why);
  // A notification arrived for this endpoint.
  void notify(uint64_t value);

  struct Stats {
    uint64_t taken = 0, completed = 0, failed = 0, invalid = 0;
    uint64_t direct = 0, direct_bytes = 0;  // direct puts the kernels reported (DeviceOpKind::kDirect)
  };
  Stats stats() const;

 private:
  struct Shared;  // everything the thread and completion callbacks touch; they keep it alive
  static void run(const std::shared_ptr<Shared>& sh);
  static size_t poll_shared(const std::shared_ptr<Shared>& sh);

  std::shared_ptr<Shared> shared_;
  std::thread thread_;
  std::mutex stop_mu_;  // serialises stop()
};

}  // namespace dmx::device
