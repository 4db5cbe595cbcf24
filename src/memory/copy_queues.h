// Copy queues made on first use, one per (memory kind, device, lane): what every user of device
// copies keeps (a stream's staging, an shm link's slots, the synchronous copy helper, cuda_ipc's
// copy engines, devmem's stager). Lane 0 is the device's queue; a user that wants several independent in-order
// queues of one device (cuda_ipc spreads its copies over `cuda_ipc_streams`) asks for lanes
// 0..n-1. A CUDA queue is a stream and owns no thread; a sim queue has a worker thread. Not
// thread-safe: one owner uses it at a time.
#pragma once

#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "core/clock.h"
#include "memory/backend.h"

namespace dmx {

class CopyQueues {
 public:
  static constexpr int kMaxLanes = 16;

  // The queue for `where`'s device (lane 0), made now if there is none (`*made` says so).
  Result<CopyQueue*> get(MemSpec where, bool* made = nullptr) { return get(where, 0, made); }
  // Lane `lane` (0 <= lane < kMaxLanes, else kInvalidArgument) of `where`'s device.
  Result<CopyQueue*> get(MemSpec where, int lane, bool* made = nullptr);
  // Waits until every copy queued so far on every lane has completed, or `deadline`; the first
  // error.
  Status drain(Deadline deadline);
  // The devices that have a queue, each once, in (kind, device) order.
  std::vector<MemSpec> devices() const;
  // A forked child inherits the queues but not their worker threads: forgets them without
  // destroying them (which would join threads that do not exist in the child).
  void abandon();

 private:
  std::map<std::tuple<int, int, int>, std::unique_ptr<CopyQueue>> queues_;  // (kind, device, lane)
};

}  // namespace dmx
