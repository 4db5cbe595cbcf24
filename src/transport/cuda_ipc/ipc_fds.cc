#include "transport/cuda_ipc/ipc_fds.h"

#include <fmt/format.h>

#include <cstring>
#include <vector>

namespace dmx {
namespace {

constexpr uint32_t kMagic = 0x46786d64;  // "dmxF" read little endian
constexpr uint32_t kVersion = 1;
constexpr size_t kMessage = 16;

}  // namespace

Status IpcFdChannel::send(uint64_t alloc_id, int fd) {
  std::array<std::byte, kMessage> m{};
  std::memcpy(m.data(), &kMagic, 4);
  std::memcpy(m.data() + 4, &kVersion, 4);
  std::memcpy(m.data() + 8, &alloc_id, 8);
  Status s = channel_.send(m, std::span<const int>(&fd, 1), Deadline::after(std::chrono::nanoseconds(0)));
  if (s.code() == Code::kTimeout)
    return Status(Code::kUnavailable,
                  fmt::format("cuda_ipc fd channel to {} is full ({} fds sent, not yet taken)", peer_, sent_.size()));
  if (!s.ok()) return s.with_peer(peer_);
  sent_.insert(alloc_id);
  return Status();
}

void IpcFdChannel::retire_sent(std::span<const uint64_t> ids) {
  for (uint64_t id : ids) sent_.erase(id);
}

Status IpcFdChannel::receive_one(Deadline deadline) {
  std::vector<std::byte> m;
  std::vector<UniqueFd> fds;
  Status s = channel_.recv(&m, 1, &fds, deadline);
  if (s.code() == Code::kTimeout) return s;
  if (!s.ok()) return Status(s.code(), fmt::format("cuda_ipc fd channel: {}", s.message())).with_peer(peer_);
  uint32_t magic = 0, version = 0;
  uint64_t id = 0;
  if (m.size() == kMessage) {
    std::memcpy(&magic, m.data(), 4);
    std::memcpy(&version, m.data() + 4, 4);
    std::memcpy(&id, m.data() + 8, 8);
  }
  if (m.size() != kMessage || magic != kMagic || version != kVersion)
    return Status(Code::kProtocol, fmt::format("cuda_ipc fd channel: a malformed message of {} B", m.size()))
        .with_peer(peer_);
  if (id == 0) return Status(Code::kProtocol, "cuda_ipc fd channel: an fd for allocation id 0").with_peer(peer_);
  if (held_.contains(id))
    return Status(Code::kProtocol, fmt::format("cuda_ipc fd channel: allocation {}'s fd came twice", id))
        .with_peer(peer_);
  if (held_.size() >= kMaxHeld)
    return Status(Code::kProtocol, fmt::format("cuda_ipc fd channel: the peer sent more than {} fds of live "
                                               "allocations",
                                               kMaxHeld))
        .with_peer(peer_);
  held_.emplace(id, std::move(fds.front()));
  return Status();
}

Result<int> IpcFdChannel::fd_for(uint64_t alloc_id) {
  Deadline deadline = Deadline::after(kArrivalWait);
  for (;;) {
    if (!broken_.ok()) return broken_;
    if (auto it = held_.find(alloc_id); it != held_.end()) return it->second.get();
    Status s = receive_one(deadline);
    if (s.code() == Code::kTimeout)
      return Status(Code::kProtocol, fmt::format("cuda_ipc: the fd of cuMem allocation {} did not come with its "
                                                 "descriptor (waited {} ms)",
                                                 alloc_id, kArrivalWait.count()))
          .with_peer(peer_);
    if (!s.ok()) broken_ = s;
  }
}

void IpcFdChannel::forget(uint64_t alloc_id) {
  // Its fd is queued by now if this side never needed it (it was sent before the descriptors that
  // retire it): take what is queued first, so that it is not held for ever.
  while (broken_.ok()) {
    Status s = receive_one(Deadline::after(std::chrono::nanoseconds(0)));
    if (s.code() == Code::kTimeout) break;
    if (!s.ok()) broken_ = s;
  }
  held_.erase(alloc_id);
}

}  // namespace dmx
