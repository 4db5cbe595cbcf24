// The cuda_ipc path's side channel for cuMem allocations (PyTorch's expandable segments, NCCL's
// buffers): such memory is shared as a POSIX fd per allocation, which only a Unix socket can carry
// (SCM_RIGHTS). The engine connects this channel at the handshake, beside the shm and control-pipe
// channels, whenever cuda_ipc is agreed (engine/transport_setup.h).
//
// Order: the owner sends an allocation's fd once, before the first chunk descriptor that names it
// leaves on stream 0; a Unix-socket send is complete when it returns (the message is queued at
// the receiver), so whenever the receiver reads that descriptor, the fd is already waiting here.
// The receiver keeps every fd until the owner retires the allocation (the retired ids of the chunk
// descriptors) or the path stops: each local GPU that copies maps it from the fd, and a mapping
// dropped from the import cache may be made again.
//
// Message (SOCK_SEQPACKET, one per fd): u32 magic "dmxF" | u32 version 1 | u64 allocation id,
// with exactly one fd. Untrusted: a malformed message, an id 0, an id sent twice, or more than
// kMaxHeld fds held at once is kProtocol naming the peer (the fds that came are closed).
//
// Threading: the sending half (sent, send, retire_sent) is used by one thread at a time (the path's
// tx mutex), the receiving half (fd_for, forget) by one thread at a time (the path's copy side);
// the two halves share nothing but the socket, which is full duplex.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "core/clock.h"
#include "core/sys.h"
#include "transport/cuda_ipc/cuda_ipc.h"
#include "transport/side_channel.h"

namespace dmx {

class IpcFdChannel final : public cuda_ipc::FdSource {
 public:
  static constexpr size_t kMaxHeld = 4096;
  // How long fd_for waits for an fd that is not queued yet (it should be; see above).
  static constexpr auto kArrivalWait = std::chrono::milliseconds(200);

  IpcFdChannel(UnixChannel channel, std::string peer) : channel_(std::move(channel)), peer_(std::move(peer)) {}

  // ---- sending half ----
  bool sent(uint64_t alloc_id) const { return sent_.contains(alloc_id); }
  // Sends `fd` (not consumed) as allocation `alloc_id`'s. Never blocks: kUnavailable when the socket
  // is full (the receiver holds back), kPeerFailed when the peer is gone.
  Status send(uint64_t alloc_id, int fd);
  // The owner retired these allocations (freed memory): their ids are not sent again.
  void retire_sent(std::span<const uint64_t> ids);

  // ---- receiving half ----
  Result<int> fd_for(uint64_t alloc_id) override;
  // Closes the fd of a retired allocation (taking the queued messages first: its fd may be among
  // them when this side never needed it).
  void forget(uint64_t alloc_id);
  size_t held() const { return held_.size(); }

 private:
  // Reads one queued message into held_; kTimeout when none comes by `deadline`.
  Status receive_one(Deadline deadline);

  UnixChannel channel_;
  const std::string peer_;
  std::unordered_set<uint64_t> sent_;
  std::unordered_map<uint64_t, UniqueFd> held_;
  Status broken_;  // the channel failed (peer gone, protocol): every later fd_for says so
};

}  // namespace dmx
