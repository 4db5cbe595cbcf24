// rpc/cuda/device.h — the service on CUDA memory: kernels launched by a CPU thread (cpu and
// batch modes) and a persistent kernel fed through a doorbell ring (gpu mode).
//
// Built with CUDA from device.cu; without it (device_stub.cc) every factory answers kUnavailable
// with the reason, so CPU-only builds and machines never reach a kernel. Objects are used by
// one thread each (the server's worker or TX thread), except where noted.
#pragma once

#include <cstdint>
#include <memory>

#include "dmx/request.h"
#include "dmx/status.h"

namespace dmx::rpc::device {

// One unit of work: `len` request bytes at `in` (device memory) to the response at `out`.
struct Item {
  const void* in = nullptr;
  void* out = nullptr;
  uint32_t len = 0;
  uint8_t method = 0;
};

// CPU-managed: each run() is one kernel launch over `n` items (a dynamic batch), then a wait.
// With `graphs`, each batch size is captured once as a CUDA graph (the item table's copy to the
// device, then the kernel) and run() replays it: one cudaGraphLaunch instead of a launch with a
// 3 KiB parameter block.
class Launcher {
 public:
  virtual ~Launcher() = default;
  static Result<std::unique_ptr<Launcher>> create(int device, bool graphs = false);
  // Launches and waits up to `timeout`; kTimeout leaves the kernel running (the caller fails).
  virtual Status run(const Item* items, uint32_t n, Duration timeout) = 0;
};

// GPU-managed: a persistent kernel polls a doorbell ring in mapped pinned host memory.
// The CPU writes items()[slot], then ring(slot); the kernel computes and publishes the slot in
// the completion ring, which poll_done() reads. ring() and poll_done() may run on two threads.
class Persistent {
 public:
  virtual ~Persistent() = default;
  static Result<std::unique_ptr<Persistent>> create(int device, uint32_t slots);
  virtual Item* items() = 0;
  virtual void ring(uint32_t slot) = 0;
  // Slots completed since the last call, up to `max`, into `out`; returns how many.
  virtual uint32_t poll_done(uint32_t* out, uint32_t max) = 0;
  // Tells the kernel to exit and waits for it (bounded).
  virtual Status stop(Duration timeout) = 0;
};

}  // namespace dmx::rpc::device
