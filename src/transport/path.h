// A payload path: where the bytes of a data chunk travel when they do not follow their header on
// a TCP stream; a Transport (transport.h) makes one per endpoint. The endpoint keeps every
// decision on its streams (matching, RTS/CTS, bounds, cancel, ACKs): a chunk's header still goes
// out on stream 0, naming the path by its id (the header's `path` byte), and carries
// the path's *descriptor* of the chunk as its payload (≤ kMaxPathDescriptor bytes: the length for
// shm, the IPC descriptor for cuda_ipc, the length for devmem). The path only moves bytes:
//
//   sender:   seq = next tx seq of the path; desc = path->post_tx(seq, src, whole); the chunk is
//             chunk_length(desc) bytes from src.ptr: all of src, or — when !whole — possibly a
//             prefix (cuda_ipc: up to the end of a cuMem block), the rest going in later chunks
//             (stream 0 writes the header + desc)  ...  Events::on_path_tx_done(seq) — the source
//             is free again
//   receiver: stream 0 reads header + desc; len = path->chunk_length(desc); bounds checked as for
//             inline chunks; path->post_rx(seq, desc, dst)  ...  Events::on_path_rx_done(seq) — the
//             bytes are in dst
//
// Sequence numbers are per path and per direction, counted by both sides in the order the headers
// travel on stream 0 (the only stream that carries path chunks). A path that delivers the bytes
// by having the *receiver* copy out of the sender's memory (cuda_ipc) sets `receiver_releases()`:
// the receiving endpoint then answers every chunk with a PATH_DONE frame (id = seq) and the
// sending endpoint treats that frame as the chunk's tx completion (the path never calls
// on_path_tx_done itself).
//
// Threading: each path runs its own progress thread (the shared machinery — thread life cycle,
// post gate and wake-up, sticky failure, the order of the last events, counters — is PathBase,
// path_base.h). post_tx/post_rx/chunk_length may be called from any thread (the endpoint calls them
// under its mutex, so they must not block on I/O or call back into Events). Events are called on
// the path's thread with no path lock held.
//
// Errors: a post that returns an error did not take the chunk and no event follows for it (the
// endpoint settles it itself). post_tx returns kUnavailable when this path cannot carry this
// particular source although carries() said its kind is fine (cuda_ipc: memory CUDA IPC cannot
// export); the endpoint then moves that transfer by the next path instead of failing it. An
// accepted chunk that cannot move completes with an error status
// (that chunk only); a path that is broken for good (peer died, corrupt ring, device error) calls
// on_path_failed once, then completes every pending chunk with that error, then on_path_stopped
// (a failed path ends without waiting for stop(); stop() is still allowed). Completions may come
// in any order (match them by seq). on_path_tx_done means "the source is free", not "delivered":
// delivery is confirmed by the endpoint's own ACKs.
//
// Lifecycle: posts are accepted from creation (applied once start() runs) until stop() or a
// failure; on_path_stopped comes exactly once per start(), after every completion. stop() is
// prompt and idempotent; when it returns the path no longer touches any user memory. Its caller
// must hold its own reference (the thread drops `keep_alive` after on_path_stopped). max_chunk()
// bounds what this side sends; a receiver checks every length against the transfer it agreed (and
// shm/devmem also against their fixed maxima, which both sides share).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dmx/memory.h"
#include "dmx/status.h"

namespace dmx {

inline constexpr size_t kMaxPathDescriptor = 256;
// A list chunk's descriptor (post_tx_list): room for 1,024 pieces of 8 bytes and a header.
inline constexpr size_t kMaxListDescriptor = 8704;

// The chunk descriptor of the shm and devmem paths: the chunk length, 8 bytes little-endian.
// Untrusted input: kProtocol naming `path` and `peer` when the size is not 8 or the length is
// over `max`. One decoder for both paths, so that the fuzzer (tests/fuzz) reaches it directly.
inline constexpr size_t kLengthDescriptorSize = 8;
Result<uint64_t> decode_length_descriptor(std::span<const unsigned char> d, uint64_t max, std::string_view path,
                                          const std::string& peer);

// Counters of one path, for EndpointStats (each copy is accounted for).
struct PathStats {
  uint64_t chunks_sent = 0, chunks_received = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;
  uint64_t host_copies = 0;    // CPU memcpy (shm slots, devmem linear data)
  uint64_t device_copies = 0;  // copy-engine copies (staging, IPC, gather)
  uint64_t wakeups = 0;        // sleeps of the progress thread that a peer or poster ended
  uint64_t inline_copies = 0;  // chunks moved on the receiving stream's thread (post_rx_now)
};

class PayloadPath {
 public:
  // One Events object per path: the endpoint knows which path calls.
  class Events {
   public:
    virtual ~Events() = default;
    virtual void on_path_tx_done(uint64_t seq, const Status& s) = 0;
    virtual void on_path_rx_done(uint64_t seq, const Status& s) = 0;
    virtual void on_path_failed(const Status& s) = 0;
    // The progress thread has exited: the path no longer touches user memory.
    virtual void on_path_stopped() = 0;
  };

  virtual ~PayloadPath() = default;
  // Its transport's name ("shm", "cuda_ipc", "devmem").
  virtual std::string_view name() const = 0;

  // Starts the progress thread; events go to `events`, which `keep_alive` keeps alive until
  // on_path_stopped has returned.
  virtual void start(Events* events, std::shared_ptr<void> keep_alive) = 0;

  // Whether chunks whose source is of this kind can travel on this path (cuda_ipc: cuda only).
  virtual bool carries(const MemSpec& src) const = 0;
  // Receiver: whether chunks into `dst` can land through this path. shm and cuda_ipc reach any
  // destination (the default); devmem only memory its gatherer writes. The receiver tells the
  // sender per transfer (CTS a1, READ_REQ a3: docs/wire.md), and the sender uses the path only then.
  virtual bool accepts(const MemSpec& dst) const { return true; }
  // False when accepts() says no to some destinations: the receiver then names this path in its
  // CTS / READ_REQ for each buffer it reaches, and the sender uses it only for those.
  virtual bool accepts_any() const { return true; }
  // Whether the peer may send WRITE_DATA chunks by this path although accepts_any() is false: a
  // write's initiator does not know the target's memory, so only a path whose receiver lands a
  // chunk for a destination it cannot reach directly in a landing zone of its own (and copies it
  // on) may carry writes. devmem: true.
  virtual bool lands_writes() const { return accepts_any(); }
  // The largest chunk this path takes in one post_tx (the endpoint cuts transfers to it).
  virtual uint64_t max_chunk() const = 0;

  // Sender: moves `src` (which stays valid until on_path_tx_done / PATH_DONE for `seq`), or when
  // `whole` is false possibly a prefix of it (at least one byte of a non-empty src; the
  // descriptor's chunk_length says how much). Returns the descriptor to send as the header's
  // payload (≤ kMaxPathDescriptor bytes); kUnavailable: not this source, try the next path (see
  // Errors above).
  virtual Result<std::vector<unsigned char>> post_tx(uint64_t seq, const MemRegion& src, bool whole) = 0;
  // Receiver: the chunk length a descriptor announces. Untrusted input: kProtocol when malformed.
  virtual Result<uint64_t> chunk_length(std::span<const unsigned char> descriptor) = 0;
  // Receiver: moves the chunk into `dst` (dst.size == chunk_length(descriptor)); when dst.ptr is
  // null, consumes the chunk and drops it (a cancelled or refused transfer).
  virtual Status post_rx(uint64_t seq, std::span<const unsigned char> descriptor, const MemRegion& dst) = 0;
  // Receiver, the small-chunk lane: as post_rx, but the path may instead move the chunk on the
  // calling thread before it returns when that is quick (cuda_ipc: a small chunk while the path is
  // idle). True: the bytes are in dst and no event follows; false: queued as by post_rx. Called
  // under the endpoint's mutex: a path bounds how long it keeps the caller.
  virtual Result<bool> post_rx_now(uint64_t seq, std::span<const unsigned char> descriptor, const MemRegion& dst) {
    DMX_RETURN_IF_ERROR(post_rx(seq, descriptor, dst));
    return false;
  }
  // True when the receiver copies out of the sender's memory (see the top of this file).
  virtual bool receiver_releases() const = 0;

  // Lists (a vectored write's small segments, docs/wire.md "Tables"): one chunk of several pieces,
  // one descriptor, one completion, so that thousands of KV-cache blocks do not each pay a chunk's
  // costs. The endpoint sends the pieces' destinations in its own table beside the descriptor.
  // max_list(): the most pieces one chunk takes (0: no lists, the default).
  virtual size_t max_list() const { return 0; }
  // Sender: moves srcs[0, *taken) as one chunk (*taken >= 1: the path may take a prefix; cuda_ipc,
  // the pieces of one allocation). Each source stays valid until the chunk's completion. Returns
  // the descriptor (<= kMaxListDescriptor bytes). kUnavailable: not these sources, send them one by one.
  virtual Result<std::vector<unsigned char>> post_tx_list(uint64_t seq, std::span<const MemRegion> srcs,
                                                          size_t* taken) {
    return Status(Code::kUnavailable, "this path takes no lists");
  }
  // Receiver: moves the chunk's pieces into `dsts`, whose sizes are the pieces' as the endpoint's
  // table gave them (the descriptor is untrusted: kProtocol when it disagrees with them or is
  // malformed). All ptrs null: consume the chunk and drop it. One event for `seq`, as post_rx.
  virtual Status post_rx_list(uint64_t seq, std::span<const unsigned char> descriptor,
                              std::span<const MemRegion> dsts) {
    return Status(Code::kProtocol, "this path takes no lists");
  }

  // Stops the progress thread without waiting for pending chunks (they complete with an error);
  // waits until nothing of the user's memory is in use. Idempotent; any thread but the path's.
  virtual void stop() = 0;
  virtual PathStats stats() const = 0;
  // One line for `dmx bench` and statistics: "shm 16 x 256 KiB slots", "cuda_ipc cuda:0->cuda:1 peer".
  virtual std::string describe() const = 0;
};

}  // namespace dmx
