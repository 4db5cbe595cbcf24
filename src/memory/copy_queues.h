// Copy queues made on first use, one per (memory kind, device): what every user of device copies
// keeps (a stream's staging, an shm link's slots, the synchronous copy helper). Not thread-safe:
// one owner uses it at a time.
#pragma once

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "memory/backend.h"

namespace dmx {

class CopyQueues {
 public:
  // The queue for `where`'s device, made now if there is none (`*made` says so).
  Result<CopyQueue*> get(MemSpec where, bool* made = nullptr);
  // Waits until every copy queued so far has completed, or `deadline`; the first error.
  Status drain(Deadline deadline);
  // The devices that have a queue, in (kind, device) order.
  std::vector<MemSpec> devices() const;
  // A forked child inherits the queues but not their worker threads: forgets them without
  // destroying them (which would join threads that do not exist in the child).
  void abandon();

 private:
  std::map<std::pair<int, int>, std::unique_ptr<CopyQueue>> queues_;
};

}  // namespace dmx
