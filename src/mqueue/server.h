// mqueue/server.h — a Lynx server: queues, workers (CPU threads or a persistent GPU kernel) and
// the dispatcher, started and stopped together.
//
// Thread-safety: start/stop from one thread; stats() from any. Lifetime: stop() (or the
// destructor) stops the dispatcher first, then the workers, then frees the queues.
#pragma once

#include <memory>

#include "mqueue/cpu_workers.h"
#include "mqueue/dispatcher.h"
#include "mqueue/gpu_workers.h"

namespace dmx::mqueue {

struct ServerConfig {
  Geometry geometry;
  MemSpec memory;  // worker memory: host (CPU workers) or cuda:N (GPU workers)
  AppKind app = AppKind::kXor;
  DispatcherConfig dispatch;
  Duration call_timeout = std::chrono::seconds(2);  // a CPU worker's wait for a call reply
  uint32_t gpu_threads = 128;                       // per worker block
  // GPU: how the dispatcher writes requests into GPU memory. false: dmx::copy_memory, each copy
  // waited for; true: queued on one CUDA stream, never waited for (docs/mqueue.md).
  bool stream_writes = true;
};

class Server {
 public:
  static Result<std::unique_ptr<Server>> start(ServerConfig config);
  ~Server();
  Dispatcher& dispatcher() { return *dispatcher_; }
  QueueSet& queues() { return *queues_; }
  CpuWorkers* cpu_workers() { return cpu_.get(); }  // nullptr with GPU workers
  Status stop();

 private:
  Server() = default;
  std::unique_ptr<QueueSet> queues_;
  std::unique_ptr<CpuWorkers> cpu_;
  std::unique_ptr<GpuWorkers> gpu_;
  std::unique_ptr<Dispatcher> dispatcher_;
  bool stopped_ = false;
};

}  // namespace dmx::mqueue
