// mqueue/cpu_workers.h — Lynx workers as CPU threads polling the queues in host memory.
//
// Worker w is one thread running the loop a GPU thread block runs (cuda/kernel.cu): wait for the
// flag of request seq, check that the response slot has a credit, run the app, write the
// response into the TX ring and release its flag. This is how the whole structure is tested on
// machines without a GPU.
//
// Thread-safety: start/stop/pause from one controlling thread. Lifetime: the QueueSet must
// outlive the workers; stop() (or the destructor) joins them.
#pragma once

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "mqueue/app.h"
#include "mqueue/queues.h"

namespace dmx::mqueue {

class CpuWorkers {
 public:
  // Worker memory must be host-accessible (kInvalidArgument otherwise).
  static Result<std::unique_ptr<CpuWorkers>> start(QueueSet* queues, AppKind app, Duration call_timeout);
  ~CpuWorkers();

  // While paused, workers take no new request (tests fill the queues this way).
  void set_paused(bool paused) { paused_.store(paused); }
  // Stops and joins the threads; a worker blocked in a call returns at its call timeout.
  void stop();
  uint64_t served() const { return served_.load(); }

 private:
  CpuWorkers(QueueSet* q) : q_(q) {}
  void run(uint32_t w, AppFn app);

  QueueSet* q_;
  Duration call_timeout_{};
  std::atomic<bool> stop_{false}, paused_{false};
  std::atomic<uint64_t> served_{0};
  std::vector<std::thread> threads_;
};

}  // namespace dmx::mqueue
