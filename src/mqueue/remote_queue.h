// mqueue/remote_queue.h — the client of a Lynx server's dmx face: two-sided requests
// (DmxRequester) or a remote queue written by one-sided writes (RemoteQueueClient), the paper's
// RDMA queues over dmx (docs/mqueue.md, "Remote MQueue Manager").
//
// RemoteQueueClient: connect() asks the dispatcher for a queue; the dispatcher lends it one
// worker's ring, registered for this client alone. submit() writes SlotHeader + payload into the
// next slot with Endpoint::write and a notification carrying the request's index; the dispatcher
// checks the index and hands the slot to the worker; the answer comes back as a message. At most
// slots() requests may be unanswered (submit says kResourceExhausted beyond). Errors name the
// server; after one, make a new client.
//
// Thread-safety: one thread per client. Lifetime: the Context outlives its clients.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dmx/context.h"
#include "mqueue/layout.h"

namespace dmx::mqueue {

struct Answer {
  uint64_t index = 0;  // the request's index (remote) or tag (two-sided)
  bool ok = false;     // false: an error answer (the payload says why)
  std::vector<uint8_t> payload;
};

class RemoteQueueClient {
 public:
  // kUnavailable with the server's reason when it lends no queue (none configured, all lent).
  static Result<std::unique_ptr<RemoteQueueClient>> connect(Context& ctx, const std::string& address, Duration timeout);
  const QueueGrant& grant() const { return grant_; }
  uint32_t unanswered() const { return static_cast<uint32_t>(next_ - answered_); }

  // Writes the next request; returns its index. Does not wait for the write; the write that last
  // used the slot must have completed (its answer came, so it has, or is about to), and its error,
  // if any, is returned here.
  Result<uint64_t> submit(std::span<const uint8_t> payload);
  // The next answer (answers come in index order), waiting up to `timeout` (0: only looks).
  Result<Answer> next_answer(Duration timeout);

  // For tests of the server's checks: writes `bytes` at `offset` of the queue region, with a
  // notification of `value` when `notify`, and waits for the write. Does not advance the index.
  // `claimed_size` (when not 0) replaces the region's size, so that dmx's own bounds check on this
  // side lets through a write the server must refuse.
  Status write_raw(uint64_t offset, std::span<const uint8_t> bytes, bool notify, uint64_t value, Duration timeout,
                   uint64_t claimed_size = 0);
  Endpoint& endpoint() { return ep_; }

 private:
  RemoteQueueClient() = default;
  void post_recv();
  Endpoint ep_;
  QueueGrant grant_{};
  RemoteRegion region_;
  Buffer src_, rx_;  // src_: a mirror of the ring's slots; rx_: one answer
  Request recv_;
  std::vector<Request> writes_;  // per slot: the last write from it
  uint64_t next_ = 0, answered_ = 0;
};

// Two-sided: one message per request (WireHeader + payload), answered by one message.
class DmxRequester {
 public:
  static Result<std::unique_ptr<DmxRequester>> connect(Context& ctx, const std::string& address, uint32_t max_payload);
  // Sends the request (tag `tag`) and posts the receive of its answer.
  Status submit(std::span<const uint8_t> payload, uint64_t tag);
  Result<Answer> next_answer(Duration timeout);
  Endpoint& endpoint() { return ep_; }

 private:
  DmxRequester() = default;
  Endpoint ep_;
  Buffer tx_, rx_;
  Request send_, recv_;
  uint32_t max_ = 0;
};

}  // namespace dmx::mqueue
