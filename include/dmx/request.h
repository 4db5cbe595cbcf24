// dmx/request.h — one asynchronous operation and how it completes.
//
// Completion contract: every operation completes exactly once — on success, error, cancel,
// timeout or close — and operations of one endpoint complete in submission order within their
// queue (sends, writes and reads in one queue; receives in another). Completion returns ownership
// of the buffer: after it, dmx touches the memory no more. If a callback was given, it runs once,
// on a dmx thread or on the thread that cancelled or closed, before test() turns true. A dmx
// thread runs the streams of many endpoints (docs/threading.md): a callback there must be short
// and must not wait for dmx (wait() refuses it with kInvalidArgument).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>

#include "dmx/status.h"

namespace dmx {

struct OpState;

using Duration = std::chrono::nanoseconds;
inline constexpr Duration kForever = Duration::max();
inline constexpr uint64_t kAnyTag = std::numeric_limits<uint64_t>::max();

// status: the outcome; bytes: bytes moved (for a receive, the size of the message).
using Callback = std::function<void(const Status& status, size_t bytes)>;

struct OpOptions {
  Duration timeout = kForever;  // the operation fails with Code::kTimeout if not done by then
  Callback on_complete{};       // optional ({}: OpOptions{.timeout = t} draws no warning)
  // Optional, in place of on_complete: also gets the operation's tag — for a receive, the tag of
  // the message it matched (a kAnyTag receive's callback cannot read Request::tag() yet).
  std::function<void(const Status& status, size_t bytes, uint64_t tag)> on_complete_tag{};
  bool notify = false;          // write only: deliver `notify_value` to the target after landing
  uint64_t notify_value = 0;
};

// A handle to an operation. Cheap to copy; all copies refer to the same operation.
// Thread-safe.
class Request {
 public:
  Request() = default;
  explicit Request(std::shared_ptr<OpState> op) : op_(std::move(op)) {}

  bool valid() const { return op_ != nullptr; }
  // Non-blocking: true once the operation has completed.
  bool test() const;
  // Waits up to `timeout` for completion. Returns the operation's status, or Code::kTimeout if it
  // did not complete in time (the operation itself continues). On a dmx thread (in a callback),
  // an operation not yet complete gives kInvalidArgument at once.
  Status wait(Duration timeout = kForever) const;
  // The final status; Code::kInternal "not complete" before completion.
  Status status() const;
  size_t bytes() const;
  uint64_t tag() const;  // receive: the tag of the matched message
  // The CRC32C (Castagnoli) of the bytes the operation moved, when the endpoint checksums
  // (setting checksum=crc32c on either side), else 0. Both sides of a transfer report the same
  // value: the sender's from its source, the receiver's from what landed, chunk by chunk.
  uint32_t crc32c() const;
  // A vectored operation refused for a bad entry: that entry's index; -1 otherwise.
  int64_t failed_entry() const;
  // Asks for completion with Code::kCancelled. Has no effect after completion; an operation
  // whose data is already on its way may still complete successfully.
  void cancel() const;

 private:
  std::shared_ptr<OpState> op_;
};

}  // namespace dmx
