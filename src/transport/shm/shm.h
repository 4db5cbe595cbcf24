// dmx shm transport: the same-host data path for host memory (and device memory staged through
// host memory when GPU peer access is impossible).
//
// The link layer's header: the engine sees the transport through shm_transport.h, tests also
// reach into shm_path.h and ring.h.
//
// Bootstrap (who talks to whom): the engine hands connect() an authenticated side channel
// (transport/side_channel.h). On it one side calls ShmLink::create() (or ShmPipe::create()), which
// makes the shared ring and passes its fds, and the other ShmLink::accept(), which maps them.
//
// Threading: a ShmLink is owned by one thread at a time; it has no internal locks. The shared ring
// is lock free across processes.
//
// Recovery contract: after any error on a ShmLink (peer died, corrupt ring, deadline), the link is
// failed for good: every pending and later operation completes with that error. Make a new link.
#pragma once

#include <poll.h>
#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/copy_crew.h"
#include "dmx/memory.h"
#include "dmx/status.h"
#include "transport/side_channel.h"

namespace dmx {
class Config;
}

namespace dmx::shm {

// Whether this process can use the shm path (memfd_create, eventfd, Unix sockets), or why not.
Status available();

// ---- the shm link ----------------------------------------------------------------------------

// A message at least this large is received into host memory with non-temporal stores (the
// default of nt_receive_min, LinkOptions::nt_receive_min): skipping the read for ownership of each
// destination line saves a third of the copy's memory traffic. From 4 MiB: 1 MiB was tried and
// measured slower on 2xH200 (docs/performance.md, "Host speed").
inline constexpr uint64_t kBulkMessage = 4ull << 20;

struct LinkOptions {
  size_t slot_size = 256 * 1024;  // bytes per ring slot (4 KiB - 64 MiB)
  uint32_t slots = 16;            // slots per direction (2 - 1024)
  // How long wait() spins before sleeping on the eventfd (latency vs CPU).
  std::chrono::microseconds spin{50};
  // Shares large host copies into and out of slots with other threads (null: this thread alone).
  // Local to each side, like spin.
  std::shared_ptr<CopyCrew> crew{};
  int copy_threads = 1;  // shm_copy_threads: the size of the crew the caller makes
  // nt_receive_min: messages from this size land in host memory with non-temporal stores
  // (UINT64_MAX: never). Local to each side.
  uint64_t nt_receive_min = kBulkMessage;
  // shm_bounce_pool: the process-wide limit of pinned bounce buffers (memory/bounce_pool.h) that
  // this link's side asks for; make_shm_path raises the limit to it.
  size_t bounce_pool = size_t(64) << 20;
};

// The options from the configuration table (shm_slot_size, shm_slots, shm_spin), checked; the crew
// is the caller's to add.
Result<LinkOptions> link_options(const Config& config);

// The message ids both sides agree on (the engine assigns them on its control channel); ids of
// one direction must be unique among the messages in flight in that direction.
using MsgId = uint64_t;

struct Completion {
  enum Kind : uint8_t { kSend, kRecv };
  MsgId id = 0;
  Kind kind = kSend;
  Status status;
  size_t bytes = 0;  // the message length (also for a kTruncated recv; 0 for other failures)
};

// Counters for statistics (each copy is accounted for).
struct LinkStats {
  uint64_t bytes_sent = 0, bytes_received = 0;
  uint64_t host_copies = 0;    // memcpy into or out of a slot
  uint64_t device_copies = 0;  // CopyQueue copies into or out of a slot (staging)
  uint64_t wakeups_sent = 0;   // eventfd writes (peer was asleep)
};

// A bidirectional pipe of messages between two processes of one host, over a memfd shared by
// both: one slot ring per direction, chunks of a message flow through the slots pipelined. Host
// memory is copied straight into and out of slots (one copy each side); device memory (cuda, sim)
// is staged through the slots with the device's CopyQueue, several chunks in flight.
//
// Everything the peer writes into shared memory is validated before use; a violation fails the
// link with kProtocol. Messages may be received in any order relative to posting (they are matched
// by MsgId); a chunk whose recv is not posted yet waits in the ring (head-of-line), so the engine
// should post the recv before telling the sender to go (rendezvous), as with every path.
class ShmLink {
 public:
  virtual ~ShmLink() = default;

  // The listening side: makes the shared region and eventfd and sends them over `channel`.
  static Result<std::unique_ptr<ShmLink>> create(UnixChannel channel, const LinkOptions& options,
                                                 Deadline deadline);
  // The connecting side: receives, validates and maps what create() sent. The ring's shape is the
  // creator's; `crew` and `nt_receive_min` are this side's (null: copies on the link's thread alone).
  static Result<std::unique_ptr<ShmLink>> accept(UnixChannel channel, Deadline deadline,
                                                 std::shared_ptr<CopyCrew> crew = nullptr,
                                                 uint64_t nt_receive_min = kBulkMessage);

  // Queue a message. `src`/`dst` stay owned by the caller until the completion; the region may be
  // of any kind dmx knows (host, pinned, cuda, sim). A recv completes with kTruncated when the
  // message is longer than `dst`, with the message length otherwise.
  virtual Status post_send(MsgId id, MemRegion src) = 0;
  virtual Status post_recv(MsgId id, MemRegion dst) = 0;
  // Lists: one message whose bytes are the pieces' in order, gathered into the slots from several
  // regions and scattered out of them into several. A send list's pieces are host memory (host,
  // pinned); a recv list's may be of any kind. Empty pieces are allowed; a list holds at least one.
  virtual Status post_send_list(MsgId id, std::vector<MemRegion> srcs) = 0;
  virtual Status post_recv_list(MsgId id, std::vector<MemRegion> dsts) = 0;
  // Consumes message `id` without copying it anywhere (a cancelled or refused transfer): its
  // chunks are released from the ring as they arrive. Completes as a recv (kRecv) with `bytes`.
  // The message must be exactly `bytes` long: any other length fails the link with kProtocol (the
  // peer announced that length elsewhere; a mismatch means it is broken), as does every other
  // header violation a normal recv checks.
  virtual Status post_discard(MsgId id, size_t bytes) = 0;

  // Moves data without blocking; appends finished operations to `out`. Returns how many.
  virtual size_t progress(std::vector<Completion>* out) = 0;
  // Blocks until progress() may have something to do: spins for options.spin, then sleeps on the
  // eventfd and the side channel. kTimeout at the deadline. Returns at once when nothing is pending.
  virtual Status wait(Deadline deadline) = 0;

  // For an epoll-based progress loop: readable when the peer rang the doorbell. The peer rings
  // only a side that announced it sleeps: call arm_wakeup() before sleeping in epoll (false: there
  // is work already, do not sleep) and disarm_wakeup() after waking.
  virtual int wake_fd() const = 0;
  virtual bool arm_wakeup() = 0;
  virtual void disarm_wakeup() = 0;
  // Also for epoll (POLLRDHUP): the side channel, which hangs up when the peer dies.
  virtual int channel_fd() const = 0;
  // Checks now whether the peer has gone (what progress() does every few hundred idle rounds, and
  // what to call when channel_fd() reports a hang-up). If it has: first takes what the peer had
  // published (a message it sent before exiting is still delivered), then fails the link — even
  // with nothing pending, so that error() says why — and appends the failed operations to `out`.
  // Returns error().
  virtual Status check_peer(std::vector<Completion>* out) = 0;
  virtual size_t pending() const = 0;  // operations posted and not completed
  virtual const Status& error() const = 0;  // ok until the link failed
  virtual LinkStats stats() const = 0;
  virtual std::string peer_name() const = 0;
  virtual const LinkOptions& options() const = 0;

  // For fault tests only: the shared control words (head, tail: 64-bit, 64 B apart) and the slot
  // headers (msg_id, offset, total, len: 64-bit each) of the ring this side receives on, as the
  // peer could overwrite them.
  virtual void* debug_rx_ring_control() = 0;
  virtual void* debug_rx_slot_header(uint32_t slot) = 0;
};

// ---- the shm pipe ----------------------------------------------------------------------------

struct PipeOptions {
  size_t ring_bytes = 1 << 20;  // per direction; a power of two, 4 KiB .. 64 MiB
};

// A bidirectional byte stream (like a connected SOCK_STREAM socket, non-blocking) between two
// processes of one host: one byte ring per direction in a sealed memfd, an eventfd doorbell per
// side. Everything read from shared memory is untrusted (validated before use): a peer that moves
// its counters out of bounds breaks the pipe with kProtocol, never makes us touch memory outside
// the ring. Bootstrap: as ShmLink's (one side create(), the other accept(), over a UnixChannel).
// Threading: one owner thread calls everything, except shutdown() (any thread; not concurrently
// with the destructor). Destroying a pipe shuts it down.
// Recovery contract: once write() or read() failed, the pipe is broken for good; make a new one.
class ShmPipe {
 public:
  virtual ~ShmPipe() = default;
  // The creating side (makes the memfd and its eventfd, sends them over `channel`) and the
  // accepting side (receives, validates, maps). Both take the channel over (its hang-up is how
  // each side learns that the other died).
  static Result<std::unique_ptr<ShmPipe>> create(UnixChannel channel, const PipeOptions& options, Deadline deadline);
  static Result<std::unique_ptr<ShmPipe>> accept(UnixChannel channel, Deadline deadline);

  // Copies as much of the buffers as fits; returns the bytes written (0 when the ring is full).
  // Rings the peer when it is asleep waiting for data. Error: the pipe is broken (shut down,
  // peer gone, corrupt ring: see error()).
  virtual Result<size_t> write(std::span<const iovec> buffers) = 0;
  // Copies up to n available bytes; returns how many (0 when nothing is there). After the peer
  // shut down or died, and once every byte it published has been read: kPeerFailed "closed by
  // the peer (pid N)". Rings the peer when it is asleep waiting for room. An empty read costs no
  // system call, except a non-blocking look at the side channel about once a millisecond (every
  // few hundred empty reads) and at the first empty read after disarm().
  virtual Result<size_t> read(void* dst, size_t n) = 0;

  // Sleeping: arm(want_room) announces that this side is about to sleep waiting for data (and,
  // with want_room, for free space to write); it returns false when there is something to do
  // already (bytes to read, or room when want_room; or the pipe is closed or broken) — then do
  // not sleep (arm() has withdrawn the announcement; disarm() is not needed). Otherwise poll the
  // pollfds() for POLLIN (the eventfd doorbell; the side channel with POLLIN|POLLRDHUP, which
  // reports the peer's death), then call disarm() (which also drains the eventfd).
  virtual bool arm(bool want_room) = 0;
  virtual void disarm() = 0;
  // Fills up to 2 pollfds (doorbell, side channel); returns how many.
  virtual int pollfds(pollfd* out) const = 0;

  // Any thread, idempotent: this side is done. Our later write()/read() fail (kClosed); the
  // peer reads what we published, then kPeerFailed "closed by the peer"; a sleeping peer is
  // woken, and so is our own owner thread if it sleeps on our doorbell.
  virtual void shutdown() = 0;
  virtual const Status& error() const = 0;  // ok until broken (as the owner thread last saw it)
  virtual std::string peer_name() const = 0;  // "pid 1234"
  virtual uint64_t wakeups_sent() const = 0;  // eventfd writes to the peer (it was asleep)
};

}  // namespace dmx::shm
