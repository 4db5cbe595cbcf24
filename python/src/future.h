// python/src/future.h — an operation's future, and how asyncio learns of completions.
//
// Completion callbacks run on dmx threads and never touch Python: they mark the operation's
// Watch fired and, when an event loop awaits it, post its id to that loop's Waker (an eventfd the
// loop reads with add_reader). Python objects are only touched on Python threads, with the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "buffer.h"
#include "dmx/request.h"

namespace dmxpy {

struct EndpointState;

// Completed-operation ids for one event loop. Thread-safe.
class Waker {
 public:
  Waker();  // raises dmx.Error when no eventfd can be made
  ~Waker();
  Waker(const Waker&) = delete;
  Waker& operator=(const Waker&) = delete;
  int fileno() const { return fd_; }
  void post(uint64_t id);         // any thread, no GIL needed
  std::vector<uint64_t> drain();  // the loop's thread

 private:
  int fd_ = -1;
  std::mutex mu_;  // guards ready_
  std::vector<uint64_t> ready_;
};

// Shared by an operation's completion callback and its Future.
struct Watch {
  std::mutex mu;  // guards the fields below
  bool fired = false;
  // Every awaiter's (loop waker, id): a Future may be awaited by several tasks or loops at once.
  std::vector<std::pair<std::shared_ptr<Waker>, uint64_t>> waiters;
  void fire();
};

// The buffers an operation uses, kept until it completes.
using Keep = std::vector<std::unique_ptr<BufferRef>>;

class Future {
 public:
  Future(dmx::Request req, std::shared_ptr<Watch> watch, Keep keep, std::shared_ptr<EndpointState> ep);
  // With the GIL held. An operation still running keeps its buffers: they go to the endpoint.
  ~Future();
  Future(const Future&) = delete;
  Future& operator=(const Future&) = delete;

  size_t wait(std::optional<double> timeout);  // raises dmx.Error; returns the bytes moved
  bool done();
  void cancel();
  uint64_t tag() const { return req_.tag(); }
  uint32_t crc32c() const { return req_.crc32c(); }
  int64_t failed_entry() const { return req_.failed_entry(); }
  // asyncio: post `id` to `waker` on completion. False when already complete (nothing posted).
  bool watch(std::shared_ptr<Waker> waker, uint64_t id);

 private:
  void finish();  // once complete: let go of the buffers

  dmx::Request req_;
  std::shared_ptr<Watch> watch_;
  Keep keep_;
  std::shared_ptr<EndpointState> ep_;
};

}  // namespace dmxpy
