// mqueue/gpu_workers.h — Lynx workers as a persistent GPU kernel (one thread block per worker),
// and the per-request kernel launch the host-centric baseline uses.
//
// No CUDA includes: CPU code calls these; cuda/kernel.cu implements them when dmx is built with
// CUDA, gpu_stub.cc (kUnavailable, saying why) otherwise.
//
// Thread-safety: one controlling thread per object. Lifetime: the QueueSet outlives GpuWorkers;
// stop() asks the kernel to end (the stop word in response memory) and waits with a deadline.
#pragma once

#include <memory>

#include "dmx/request.h"
#include "mqueue/queues.h"

namespace dmx::mqueue {

// Whether GPU workers can run here, and if not why.
Status gpu_workers_available(int device);

class GpuWorkers {
 public:
  // Launches the persistent kernel: layout().g.workers blocks of `threads` threads on the device
  // of the QueueSet's worker memory (which must be cuda:N).
  static Result<std::unique_ptr<GpuWorkers>> start(QueueSet* queues, AppKind app, uint32_t threads = 128);
  ~GpuWorkers();
  // Sets the stop word and waits up to `timeout` for the kernel to end; kTimeout if it did not
  // (then the queue memory must not be freed), or the kernel's error.
  Status stop(Duration timeout = std::chrono::seconds(5));

  struct Impl;

 private:
  explicit GpuWorkers(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A WorkerWriter that queues each copy on one CUDA stream and returns at once: stream order puts
// a flag after its payload. Errors of earlier copies surface at a later call.
Result<std::unique_ptr<WorkerWriter>> make_stream_writer(int device);

// The host-centric baseline's kernel: one launch per request on its own stream, waited for.
class GpuLauncher {
 public:
  static Result<std::unique_ptr<GpuLauncher>> create(int device);
  ~GpuLauncher();
  // out[i] = in[i] ^ kXorKey for i < len (device pointers), launched and waited for (deadline).
  Status run_xor(const void* in, void* out, uint32_t len, Duration timeout = std::chrono::seconds(5));

  struct Impl;

 private:
  explicit GpuLauncher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dmx::mqueue
