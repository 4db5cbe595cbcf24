// The cuda_ipc payload path (see transport/path.h): chunks whose source is CUDA device memory, between
// two processes of one host. The sender exports the chunk (one IPC handle per allocation, made once
// and cached; for a cuMem allocation its fd, sent once over the fd side channel, transport/cuda_ipc/ipc_fds.h)
// and sends its descriptor in the chunk header; a cuMem region that runs into the next block goes
// as one chunk per block (post_tx takes the part up to the block's end). The receiver maps the
// allocation (import cache) and copies the chunk out of the sender's memory into its destination
// (cuda, pinned or host memory) on a copy engine of one of its GPUs; its engine then answers
// PATH_DONE, which frees the source (receiver_releases() is true; the path never calls
// on_path_tx_done).
//
// Threading: post_tx exports under the path's tx mutex (quick: a few driver calls; the first chunk
// of an allocation also makes its IPC handle). post_rx validates the descriptor and queues the chunk
// under the post lock; the path's progress thread (PathBase, transport/path_base.h) issues the
// copies on the copy engines (one per local GPU used, created lazily), polls them (spin ~200 us,
// then 20 us sleeps that a post ends) and reports completions with no lock held. post_rx_now (the
// small-chunk lane) may instead issue and poll a small chunk's copy on the caller's thread. The copy
// side (engines, copies in flight, the failure state) is shared under engine_mu_; lock order:
// engine_mu_ -> the post lock; the tx mutex is never nested. A broken device fails the path: its
// thread drains the copies in flight (bounded) and ends.
//
// Same process: CUDA IPC cannot open a handle in the process that made it, and between two
// endpoints of one process none is needed: the path then runs `in_process` (the receiver copies
// straight from the exporter's pointer, found in the process's table of exports; cuda_ipc.h). The
// engine uses that mode only when the kernel proves the peer is this process (SO_PEERCRED of a
// side channel: cuda_ipc_usable_between). Otherwise a descriptor that names our own pid fails its
// chunk with that reason, and in_process a descriptor from another pid fails.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/config.h"
#include "topo/push.h"
#include "transport/cuda_ipc/cuda_ipc.h"
#include "transport/path.h"
#include "transport/side_channel.h"

namespace dmx {

// The largest chunk of one post_tx is the setting cuda_ipc_chunk (default 256 MiB, ~0.7 ms at
// NVLink speed): per-chunk costs (header, export, PATH_DONE, completion polling) then vanish next
// to the copy. Measured on 2 x H200, GPU0->GPU1, 1 GiB sends: 16 MiB chunks 352 GB/s, 64 MiB 371,
// 256 MiB 378 (cudaMemcpyPeer: 390).

// What a cuda_ipc chunk header carries: the IpcDescriptor of the source chunk (136 B), then the ids
// of up to kCudaIpcMaxRetired allocations the sender found freed since it last said so (8 B each;
// the count follows from the size). The receiver unmaps those before it copies this chunk, so a
// user who frees and re-allocates sender memory does not leave the old memory mapped (and alive)
// in the receiver.
inline constexpr size_t kCudaIpcMaxRetired = (kMaxPathDescriptor - cuda_ipc::IpcDescriptor::kWireSize) / 8;
struct IpcChunkDescriptor {
  cuda_ipc::IpcDescriptor source;
  std::vector<uint64_t> retired;  // allocation ids, none zero

  std::vector<unsigned char> encode() const;
  // Untrusted input: kProtocol when malformed (size, IpcDescriptor::decode, zero ids).
  static Result<IpcChunkDescriptor> decode(std::span<const unsigned char> bytes);
};

// What a cuda_ipc table chunk's header carries (PayloadPath::post_tx_list): the IpcDescriptor of
// one region of one allocation that holds every piece, the count of pieces n and of retired ids r
// (u32 each), each piece's offset in that region (u64; the lengths are in the endpoint's table),
// then r retired allocation ids (u64, none zero). At most kCudaIpcMaxList pieces, kCudaIpcMaxRetired ids.
inline constexpr size_t kCudaIpcMaxList = 1024;
struct IpcListDescriptor {
  cuda_ipc::IpcDescriptor source;
  std::vector<uint64_t> offsets;
  std::vector<uint64_t> retired;

  std::vector<unsigned char> encode() const;
  // Untrusted input: kProtocol when malformed (sizes, counts, IpcDescriptor::decode, zero ids).
  // The pieces' bounds need their lengths: the path checks them against the destinations.
  static Result<IpcListDescriptor> decode(std::span<const unsigned char> bytes);
};

// Whether this process can offer cuda_ipc (CUDA build, driver, a GPU), or why not. Calls CUDA.
Status cuda_ipc_path_available();

// Whether two endpoints whose HELLOs name these pids may use cuda_ipc: between two processes, yes
// (IPC handles); within one (equal pids), only when `proven_same_process` (a side channel's kernel
// credentials name this process), else kUnavailable with the reason. Pids compare only within one
// pid namespace: the caller must already know the peer is on this host.
Status cuda_ipc_usable_between(uint32_t my_pid, uint32_t peer_pid, bool proven_same_process);

// `peer`: names the peer in messages and keys the import cache. `in_process`: the peer is this
// process (see above). `fd_channel`: the side channel for cuMem allocations' fds (transport/cuda_ipc/ipc_fds.h);
// without it such memory goes by other paths (post_tx: kUnavailable). Fails with the reason when
// cuda_ipc_path_available() does.
Result<std::unique_ptr<PayloadPath>> make_cuda_ipc_path(const Config& config, std::string peer, bool in_process = false,
                                                        std::optional<UnixChannel> fd_channel = std::nullopt);

// The same path without the availability check: makes no CUDA call until a chunk is exported or
// copied (tests of the CUDA-free logic use it in processes that must not initialise CUDA).
// Which small copies the path's SMs make instead of a copy engine, and why (gpu_push,
// gpu_push_max, cuda_ipc_copy_by; topo/push.h).
topo::PushPlan cuda_ipc_push_plan(const Config& config);

std::unique_ptr<PayloadPath> new_cuda_ipc_path(const Config& config, std::string peer, bool in_process = false,
                                               std::optional<UnixChannel> fd_channel = std::nullopt);

}  // namespace dmx
