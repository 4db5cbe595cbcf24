// The shm payload path (see transport/path.h): chunk bytes of an endpoint whose peer is on the same
// host travel through an shm::ShmLink (two slot rings in a shared memfd) instead of TCP.
//
//   descriptor   the chunk length, 8 bytes little-endian (nothing else: the ShmLink message id is
//                the path's sequence number, which both sides count on stream 0)
//   memory       host, pinned, cuda and sim sources and destinations (the link stages device
//                memory through its slots with the device's copy queue)
//   discard      post_rx with dst.ptr == nullptr consumes the chunk from the ring without copying
//                (ShmLink::post_discard; the message must still be exactly the announced length)
//   lists        post_tx_list: up to kShmMaxList host pieces within kShmMaxChunk, one link message
//                gathered into the slots; the receiver scatters it over its pieces (any memory
//                kind); the descriptor is the total length, checked against the pieces' sum
//
// Threading: one progress thread per path (PathBase, transport/path_base.h) owns the link.
// post_tx/post_rx queue under the post lock and wake the thread (eventfd) only when it sleeps. The thread spins for `shm_spin` after
// the last activity, then sleeps in ppoll on its eventfd, the link's doorbell and the side channel
// (POLLRDHUP: peer death). Events are delivered on that thread with no path lock held.
//
// Lifecycle: posts are accepted from creation until the path stops or fails (later ones return
// kClosed and produce no event); posts made before start() are applied once it runs. Every
// accepted post completes exactly once. on_path_stopped is called exactly once per start(), on the
// path's thread, after every completion — also when stop() came before start(). Without start()
// no event is ever called (there is no Events to call). stop() destroys the link itself (waiting
// for the thread's current round, never for an event callback), so it is prompt and may be called
// while holding a lock the events take, and from an event handler; the destructor joins the
// thread, so do not destroy a path under such a lock while its thread may still be delivering
// events. The thread drops keep_alive after on_path_stopped: if that was the path's last owner,
// the path is destroyed there (the reaper joins the thread), so a caller of stop() must hold its own
// reference to whatever owns the path.
#pragma once

#include <memory>

#include "core/clock.h"
#include "core/config.h"
#include "transport/path.h"
#include "transport/shm/shm.h"

namespace dmx {

// The largest chunk post_tx takes, and the largest length chunk_length() accepts from a peer. A
// constant, not a setting, so that both sides agree on it.
inline constexpr uint64_t kShmMaxChunk = 4ull << 20;
// Each chunk is a link message: the largest must reach the link's bulk copy (shm::kBulkMessage).
static_assert(kShmMaxChunk >= shm::kBulkMessage);
// The most pieces of a list chunk (post_tx_list): the wire's most; a list is one link message of
// host pieces within kShmMaxChunk, gathered into the slots and scattered out of them.
inline constexpr size_t kShmMaxList = 1024;
inline constexpr size_t kShmDescriptorSize = kLengthDescriptorSize;

// `creator`: this side makes the shared region (ShmLink::create) — the side that accepted the
// Unix connection; the other side maps it (ShmLink::accept). `options` come from shm::link_options:
// the layout is the creator's (shm_slot_size, shm_slots); the spin time (shm_spin) and the crew
// that shares large copies (null: the path's thread alone) are each side's own.
Result<std::unique_ptr<PayloadPath>> make_shm_path(UnixChannel channel, bool creator, const shm::LinkOptions& options,
                                                   Deadline deadline);

}  // namespace dmx
