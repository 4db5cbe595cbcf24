#include "memory/copy_queues.h"

#include <fmt/format.h>

#include "core/crc32c.h"

namespace dmx {

Result<CopyQueue*> CopyQueues::get(MemSpec where, int lane, bool* made) {
  if (made != nullptr) *made = false;
  if (lane < 0 || lane >= kMaxLanes)
    return Status(Code::kInvalidArgument,
                  fmt::format("copy queue lane {} of {}: lanes are 0..{}", lane, to_string(where), kMaxLanes - 1));
  auto key = std::make_tuple(static_cast<int>(where.kind), where.device, lane);
  if (auto it = queues_.find(key); it != queues_.end()) return it->second.get();
  DMX_ASSIGN_OR_RETURN(MemoryBackend * backend, backend_for(where));
  DMX_ASSIGN_OR_RETURN(std::unique_ptr<CopyQueue> q, backend->create_queue());
  CopyQueue* raw = q.get();
  queues_.emplace(key, std::move(q));
  if (made != nullptr) *made = true;
  return raw;
}

Status CopyQueues::drain(Deadline deadline) {
  Status first;
  for (auto& [key, q] : queues_) {
    auto fence = q->record();
    Status s = fence.ok() ? q->wait(*fence, deadline) : fence.status();
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

std::vector<MemSpec> CopyQueues::devices() const {
  std::vector<MemSpec> out;
  for (const auto& [key, q] : queues_) {
    MemSpec d{static_cast<MemKind>(std::get<0>(key)), std::get<1>(key)};
    // A device's lanes are adjacent in the map.
    if (out.empty() || out.back().kind != d.kind || out.back().device != d.device) out.push_back(d);
  }
  return out;
}

void CopyQueues::abandon() {
  for (auto& [key, q] : queues_) (void)q.release();
  queues_.clear();
}

Result<uint32_t> checksum_memory(MemSpec where, const void* p, size_t n, Deadline deadline) {
  DMX_ASSIGN_OR_RETURN(MemoryBackend * backend, backend_for(where));
  if (backend->host_accessible()) return crc32c::of(p, n);
  // A queue per thread and device: a CopyQueue serves one thread at a time.
  thread_local CopyQueues queues;
  DMX_ASSIGN_OR_RETURN(CopyQueue * q, queues.get(where));
  DMX_ASSIGN_OR_RETURN(uint64_t ticket, q->checksum(p, n));
  DMX_ASSIGN_OR_RETURN(uint64_t fence, q->record());
  DMX_RETURN_IF_ERROR(q->wait(fence, deadline));
  return q->checksum_result(ticket);
}

}  // namespace dmx
