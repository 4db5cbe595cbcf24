// EagerStage: staging of small device payloads started by the thread that posts them.
//
// An eager send from device memory (a payload of at most kPiece bytes) must reach a pinned buffer
// before its frame can be written. The posting thread starts that device->host copy at once, into
// a piece of a staging slot reserved for this, and queues the frame; the stream's worker then only
// waits for the copy's end and writes. The copy runs while the worker is still on its way to the
// frame, instead of after it got there. When the posting thread cannot start the copy (the slot is
// not set up yet — the worker makes it when it first meets device memory —, every piece is in use,
// the payload is larger than a piece, the copy is refused, the stream is closing), the frame goes
// as before: the worker stages it itself through its reserved control slot.
//
// Threading: start() from any thread; the rest from the stream's worker. One mutex guards the
// pieces and the copy queues (a CopyQueue is used by one thread at a time).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/clock.h"
#include "memory/backend.h"

namespace dmx::tcp {

struct TxItem;

class EagerStage {
 public:
  static constexpr size_t kPiece = 16 * 1024;
  static constexpr size_t kMaxPieces = 64;

  // Worker: cuts `slot` (pinned for the stream's device backend) into pieces; once.
  void provide(void* slot, size_t slot_size);
  // Any thread: starts the copy of item's device payload into a free piece and notes the piece,
  // queue and fence in `item`. False: nothing was started (see above).
  bool start(TxItem& item);
  // Worker: waits until item's copy has ended (polling; fails at the deadline or on a copy error).
  Status wait(const TxItem& item, Deadline deadline);
  // The piece's bytes (the payload once wait() returned ok).
  const void* data(const TxItem& item) const;
  // Worker: the piece is free again (the frame was written, or dropped after wait() returned).
  void release(TxItem& item);
  // Worker, when it stops: waits for copies in flight, refuses new ones.
  void close();

 private:
  std::mutex mu_;
  char* base_ = nullptr;
  std::vector<int> free_;
  std::map<int, std::unique_ptr<CopyQueue>> queues_;  // by (kind << 16 | device)
  bool closed_ = false;
};

}  // namespace dmx::tcp
