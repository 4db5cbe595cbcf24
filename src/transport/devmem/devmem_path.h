// The devmem payload path (see transport/path.h): chunk bytes of an endpoint whose peer is on
// another host travel on a DEDICATED TCP connection (the "data socket") that carries raw payload
// bytes only — with devmem RX the whole TCP payload lands in the bound dmabuf, so no dmx header may
// travel on it. Both sides process chunks in the same order (the order of their headers on stream
// 0 = the byte order on the data socket), so the receiver, given (seq, length, dst), reads exactly
// `length` bytes.
//
//   descriptor   the chunk length, 8 bytes little-endian; at most kDevmemMaxChunk
//   carries      CUDA sources (and sim sources when the path's memory is host memory, i.e. over the
//                socket-pair double). Host and pinned sources are not carried: their payload stays
//                inline on the TCP streams (the NIC would have to read host memory through a dmabuf
//                of host memory, which gains nothing).
//   TX direct    a source inside memory registered with Context::register_memory is sent straight
//                from it: the registration carries a TxRegion (tx_regions.h), bound with bind-tx
//                on this NIC at its first send and reused; sendmsg takes the dma-buf offset of
//                the source. The source is in use until the zerocopy completion (on_path_tx_done
//                then). Where the region cannot be bound, or the source is not registered: the
//                ring, below; counters direct_sends / ring_sends and tx_note say which and why.
//   TX           a path-owned TX ring (64 MiB of `HostSeams::memory`, from the machine's placement:
//                HostSeams::place, booked to "devmem TX ring of IF to PEER"), bound with bind-tx once
//                at creation. Each chunk is copied device-to-device into the ring (the CUDA gather
//                kernel with 4 KiB descriptors, or, when the ring is host memory, the source's copy
//                queue), then sent zero-copy (sendmsg MSG_ZEROCOPY + SCM_DEVMEM_DMABUF) from the
//                ring. The source is free — on_path_tx_done — as soon as its copy into the ring is
//                complete; the ring space is reused only after the kernel reported the send's
//                zerocopy completion. Why a ring and not a binding of each user allocation: no
//                per-allocation export/bind on the hot path, no cache to invalidate when the user
//                frees memory, bounded pinned NIC mappings; the cost is one D2D copy per chunk
//                (~1.4 TB/s on H100, far above any NIC).
//   RX           io_uring zcrx or devmem RX (setting devmem_rx; devmem_path_rx.h says which is
//                chosen and how it falls back; the describe() text names the receiver and why not
//                the other). zcrx: one ifq per path on a free queue of devmem_queues, its area a
//                dma-buf of path-owned memory (devmem_rx_pool bytes, placed as the ring), buffers
//                back through the refill ring in batches after the gather (zcrx.h). devmem RX:
//                the process's RX pool in `memory` (setting devmem_rx_pool; placed as the ring,
//                booked to "devmem RX pool of IF"), bound with bind-rx to the devmem queues once
//                (rx_binding.h). DevmemRx receives (recvmsg MSG_SOCK_DEVMEM),
//                validates every cmsg, gathers fragments and linear chunks into dst, and returns
//                the tokens after the gather completed. accepts() names the memory the gatherer
//                writes (CUDA on the pool's device; host, pinned or sim over the double): a
//                receiver announces the path only for such buffers (CTS, READ_REQ).
//   landing      A write's initiator does not know the target's memory, so writes take the path
//                whenever it carries the source (lands_writes). A chunk for a destination the
//                gatherer cannot write is gathered into the landing zone (HostSeams::place:
//                kDevmemMaxChunk bytes from the machine's placement, made at its first use; one
//                chunk at a time), then copied on by a copy queue and completed at that copy's
//                fence. Without a landing zone such a chunk is consumed, dropped and completed with
//                kUnavailable and the reason (that chunk only).
//   discard      post_rx with dst.ptr == nullptr consumes the bytes without copying (tokens are
//                still returned).
//   lists        post_tx_list: up to kDevmemMaxList pieces of one kind of memory, within
//                kDevmemMaxChunk bytes, go as one chunk: gathered into one range of the ring (one
//                gather launch on a device ring), one send, one completion; the descriptor is the
//                total length. post_rx_list receives the bytes into the pieces in order (a receive
//                call at least per piece), or lands the whole list and copies each piece on; a
//                descriptor whose length is not the table's sum is a protocol error.
//   failures     a bad cmsg (unknown dmabuf id, fragment outside the pool, token beyond 31 bits,
//                byte counts that do not add up), a peer that closed or reset the data socket, a
//                failed sendmsg, or bytes the peer sent beyond what it announced (detected when the
//                peer has shut its sending side down and unclaimed bytes stay unread for
//                kDevmemExtraGrace with no receive posted) fail the path: on_path_failed once, with
//                an error naming the peer, then every pending chunk completes with it, then
//                on_path_stopped. Tokens are
//                never leaked (DevmemRx returns every one it saw, valid or not).
//
// Threading and lifecycle (the same contract as shm_path.h; the machinery is PathBase,
// transport/path_base.h): one progress thread per path owns the socket, DevmemRx/DevmemTx, the
// gatherers and the ring. post_tx/post_rx queue under the post lock and wake the thread (eventfd). Posts are accepted from creation until the path stops or fails
// (later ones return kClosed / the failure and produce no event); posts made before start() are
// applied once it runs. Every accepted post completes exactly once. on_path_stopped is called
// exactly once per start(), on the path's thread, after every completion — also when stop() came
// before start(). The thread does its I/O in rounds under `io_mu_` and delivers events outside it;
// stop() takes `io_mu_` (waiting for the current round, never for an event callback), waits for
// the copies into and out of user memory (bounded), and returns: it is prompt and may be called
// while holding a lock the events take. The destructor joins the thread, so do not destroy a path
// under such a lock while its thread may still be delivering events.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/config.h"
#include "core/sys.h"
#include "transport/path.h"
#include "transport/devmem/devmem.h"

namespace dmx {

// The largest chunk post_tx takes and chunk_length() accepts from a peer: a constant, not a
// setting, so that both sides agree on it.
inline constexpr uint64_t kDevmemMaxChunk = 16ull << 20;
inline constexpr uint64_t kDevmemTxRing = 64ull << 20;
// The most pieces of a list chunk (post_tx_list): the wire's most, within kDevmemMaxChunk bytes.
inline constexpr size_t kDevmemMaxList = 1024;
inline constexpr size_t kDevmemDescriptorSize = kLengthDescriptorSize;
// How long unclaimed bytes may sit on a data socket whose peer has shut down its sending side.
inline constexpr int kDevmemExtraGraceMs = 500;

// Whether this side can offer devmem for new endpoints: devmem::usable(devmem_ifname), then the
// path's own needs (devmem_queues set and well-formed, a CUDA device). Ok, or kUnavailable with
// the exact first reason (for statistics and `dmx bench`).
Status devmem_path_offer(const Config& config);
// Whether zcrx can receive for devmem here (kernel 6.16+, the zcrx probe, the NIC's queue API):
// ok, or kUnavailable with the reason. Non-destructive.
Status devmem_zcrx_offer(const Config& config);

// The path over `data_socket` (a connected TCP socket dedicated to payload, already authenticated
// by the engine; the path owns it from now on) with the production seams on CUDA device
// `cuda_device` (devmem::kernel_seams): binds a devmem_rx_pool-byte RX pool and the TX ring, both
// from the machine's placement where it has them (devmem::place_memory: else the path's own).
// kUnavailable / kIo with the kernel's reason when a binding or allocation fails.
Result<std::unique_ptr<PayloadPath>> make_devmem_path(UniqueFd data_socket, const Config& config, std::string peer,
                                                      int cuda_device = 0);

// Steers the data socket's incoming packets to `queue` (the zcrx receiver's one queue), or, when
// nullopt, to one of devmem_queues (devmem RX); the result (the NIC flow rule) is kept until the
// path is destroyed.
using DevmemSteer = std::function<Result<std::shared_ptr<void>>(std::optional<uint32_t> queue)>;

// The same over any seams: tests pass devmem::testing::SimNic::seams() (tests/devmem/
// socket_double.h, library dmx_devmem_double) and a connected socket pair, so real bytes move.
// The receiver is chosen by setting devmem_rx (devmem_path_rx.h); `steer` (the production
// overload's NIC flow rule) is called once it is known.
Result<std::unique_ptr<PayloadPath>> make_devmem_path(UniqueFd data_socket, const Config& config, std::string peer,
                                                      devmem::HostSeams seams, DevmemSteer steer = nullptr);

// Devmem-specific counters of a path made by make_devmem_path (for tests and detailed statistics;
// PathStats folds them: device_copies = gathers + TX staging copies, host_copies = linear chunks).
struct DevmemPathCounters {
  uint64_t fragments = 0, linear_bytes = 0, linear_chunks = 0, devmem_bytes = 0, plain_calls = 0;
  uint64_t tokens_returned = 0, tokens_unknown = 0, tokens_outstanding = 0;
  uint64_t gathers = 0, stagings = 0, sendmsg_calls = 0, notifications = 0, zerocopy_copied = 0;
  uint64_t direct_sends = 0;  // chunks sent straight from a registered region bound for TX
  uint64_t ring_sends = 0;    // device chunks staged through the TX ring
  std::string tx_note;        // where the last device chunk went from, and why ("ring: ...")
  // Chunks for memory the gatherer cannot write (writes into such registered regions): gathered
  // into the landing zone, then copied on.
  uint64_t landed_chunks = 0, landed_bytes = 0;
  std::string landing_note;   // the landing zone, once made ("GPU pool cuda:0 (...), ...")
  // The zcrx receiver (devmem_path_rx.h); zero with devmem RX.
  uint64_t zcrx_cqes = 0, zcrx_bytes = 0, zcrx_refills = 0, zcrx_refill_flushes = 0, zcrx_arms = 0;
  uint64_t zcrx_buffers_held = 0;
  std::string rx_note;        // the receiver ("zcrx: queue 13 ..." / "devmem RX: ...; zcrx not used: ...")
};
// Counters of `path` when it is a devmem path, else nullopt-like false.
bool devmem_path_counters(const PayloadPath& path, DevmemPathCounters* out);

}  // namespace dmx
