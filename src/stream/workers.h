// The threads that run streams. A set of workers, each an event loop over many streams, so that
// threads do not grow with endpoints or streams (docs/threading.md):
//  - a stream that moves bytes stays *active*: its worker turns it (Stream::turn, one pass of
//    transmit, receive, copies and timers) round after round, and keeps it active through the
//    busy-poll window (not after bulk data: kBulkBurst in stream.h);
//  - an idle stream *parks*: its conduit's file descriptors go into the worker's epoll set
//    (one-shot) and its next deadline (keepalive, peer timeout, an operation's deadline, copies in
//    flight) into the worker's timer map. An event, the deadline or a poster's wake-up
//    (Stream::wake → Worker::ready) makes it active again;
//  - a worker with no active stream sleeps in epoll_pwait2 until the first of those.
// A stream that ends (failure or stop) leaves its worker at once; what ends it may block (copies
// to drain, the endpoint's paths to stop), so that runs on the set's *closer* thread, never on a
// worker that other endpoints' streams share.
//
// Threads start as streams arrive: a set of N workers starts at most N, plus the closer once a
// stream ends. A stream that carries data goes to the worker with the fewest such streams, any
// other stream to the one with the fewest streams (ties rotate): so the data streams of one
// endpoint, and of the endpoints beside it, run on different workers when there are enough, and
// control streams fill the gaps (docs/threading.md). The counts are a hint: endpoints created at
// once on two threads may still pick one worker. Blocking inside a turn holds up every stream of
// that worker: streams wait only on copies they issued (bounded), and a completion callback, which
// may run on a worker, must not wait for dmx (include/dmx/request.h).
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/clock.h"

namespace dmx::stream {

class Stream;
class Worker;

// A stream's place on its worker. Owned by the worker thread, except where noted.
struct WorkerSlot {
  // Set when the stream joins its worker, never changed; any thread reads it (wake, stop).
  std::atomic<Worker*> worker{nullptr};
  std::shared_ptr<void> keep_alive;
  std::function<void()> after_exit;
  bool bulk = false;    // it carries data (Workers::add); set before the worker takes it
  bool known = false;   // the worker has taken it
  bool parked = false;  // and `timer` is valid
  std::multimap<Clock::time_point, Stream*>::iterator timer;
  int fds[3] = {-1, -1, -1};  // registered in the worker's epoll set
  // Guarded by the worker's mutex: the stream is on its worker (not yet ended), and is in its
  // ready list.
  bool attached = false;
  bool queued = false;
};

// Any thread: makes `s` active on its worker (a wake-up, a stop), unless it has ended.
void ready(Worker* w, Stream* s);

class Workers {
 public:
  // At most `threads` workers (≥ 1); `name` prefixes the thread names ("dmx-w").
  Workers(int threads, std::string name);
  ~Workers();
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  // Runs `s` on one of the workers until it ends. `bulk`: it carries data, not only control
  // frames (placement, above). `keep_alive` (its host) is held until then; `after_exit` runs
  // last, after `keep_alive` was dropped (it must not touch the host or `s`).
  void add(Stream* s, bool bulk, std::shared_ptr<void> keep_alive, std::function<void()> after_exit);
  // The calling thread is a worker or closer of any set: it must not wait for streams.
  static bool on_worker_thread();
  // Per worker: the streams it runs that have not ended, and those of them that carry data.
  struct Load {
    uint32_t streams = 0, bulk = 0;
  };
  std::vector<Load> loads() const;

  struct Core;

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace dmx::stream
