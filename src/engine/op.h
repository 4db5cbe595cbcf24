// Per-operation state. The lifecycle is written as data; fields are guarded by the owning
// endpoint's mutex unless marked otherwise.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "dmx/memory.h"
#include "dmx/request.h"
#include "wire/frame.h"

namespace dmx {

class EndpointImpl;
struct Registered;

// A vectored operation's bytes (endpoint/vec_list.cc): segments in the operation's byte order,
// each contiguous in local memory and, for a write or read, in one remote region. Adjacent entries
// are merged; zero-length ones dropped. Fixed once built.
struct VecSeg {  // no default values: a long list's layout is sized first and written in place
  uint64_t at;   // offset in the operation's bytes
  char* local;
  uint64_t length;
  uint64_t rkey, roffset;  // write / read
};
// An allocator whose resize() leaves trivial elements as they were (unwritten).
template <typename T>
struct NoInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = NoInitAllocator<U>;
  };
  NoInitAllocator() = default;
  template <typename U>
  NoInitAllocator(const NoInitAllocator<U>&) noexcept {}
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
};
struct VecLayout {
  std::vector<VecSeg, NoInitAllocator<VecSeg>> segs;
  uint64_t total = 0;
  MemSpec where;  // every local region of a list is of one kind
  // The segment holding byte `at` of the operation (at < total). `hint`: where a caller that
  // walks in order found the last one; that segment and the next are tried before a search.
  size_t find(uint64_t at, size_t hint = 0) const;
  // [at, at + len) as local memory when it lies in one segment; a null region otherwise. `hint`
  // as for find; set to the segment found.
  MemRegion slice(uint64_t at, uint64_t len, size_t* hint = nullptr) const;
};

enum class OpType : uint8_t {
  kSend,
  kRecv,
  kWrite,
  kRead,
  kReadResponse,  // internal: the target side of a peer's read (not in any completion queue)
};

// kPosted ──► kActive ──► kFinished ──► kDelivered
//    │           │            ▲
//    └───────────┴─► kStopping┘
// kPosted:    waiting — a rendezvous send for CTS, a recv for a message, a read for its data
// kActive:    data moving (chunks handed to streams, or arriving into the buffer)
// kStopping:  the outcome is decided (cancel, timeout, refusal) but chunks in flight still use
//             the buffer; finishes when `inflight` reaches 0
// kFinished:  outcome final; waits for its turn in the completion order
// kDelivered: completion delivered (test() is true, the callback has run)
enum class OpPhase : uint8_t { kPosted, kActive, kStopping, kFinished, kDelivered };

struct OpState {
  OpType type = OpType::kSend;
  OpPhase phase = OpPhase::kPosted;
  MemRegion region;
  uint64_t tag = 0;         // recv: the matched tag once matched
  uint64_t posted_tag = 0;  // recv: the tag (or kAnyTag) it was posted with
  uint64_t id = 0;      // message sequence (send/recv) or operation id (write/read)
  uint64_t total = 0;   // bytes the operation moves
  uint64_t handed = 0;  // transmit: bytes handed to streams
  uint64_t done = 0;    // bytes written (transmit) or landed (receive)
  int inflight = 0;     // chunks handed but not yet written / payloads being read into the buffer
  bool eager = false;
  bool acked = false;   // write: the target's ACK came; it finishes once no chunk is in flight
  Status outcome;       // decided at kStopping / kFinished
  // One-sided.
  uint64_t rkey = 0, roffset = 0;
  bool notify = false;
  uint64_t notify_value = 0;
  std::shared_ptr<Registered> reg;  // kReadResponse: the region being read
  // Vectored: the layout (region then names none of the memory; region.size is the total). A
  // vectored kReadResponse holds its regions in `regs`.
  std::shared_ptr<const VecLayout> vec;
  std::vector<std::shared_ptr<Registered>> regs;
  std::vector<unsigned char> bounce;  // a vectored recv's eager message, scattered once landed
  int64_t failed_entry = -1;          // a vectored op refused for a bad entry: its index (set before start)
  std::weak_ptr<EndpointImpl> ep;
  Clock::time_point deadline = Clock::time_point::max();
  Clock::time_point posted;  // for the latency metric
  uint32_t via = 0;          // path bits (1 << path id) of the paths that carried its bytes (metrics)
  uint32_t crc_raw = 0;      // with checksums: its chunks' CRCs folded (crc32c::fold)
  Callback callback;

  // Completion, readable without the endpoint's mutex.
  std::atomic<bool> completed{false};
  // The bytes it moves as far as known: a receive's message size once matched, 0 before.
  // Request::wait spins only while this is small.
  std::atomic<uint64_t> known_size{0};
  std::mutex mu;  // guards the fields below until `completed`
  std::condition_variable cv;
  Status final_status;
  size_t final_bytes = 0;
  uint32_t final_crc = 0;
  uint64_t matched_tag = 0;
};

}  // namespace dmx
