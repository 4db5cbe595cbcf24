#include "transport/tcp/eager_stage.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "core/log.h"
#include "core/sys.h"
#include "transport/tcp/stream.h"

namespace dmx::tcp {

void EagerStage::provide(void* slot, size_t slot_size) {
  std::lock_guard<std::mutex> lock(mu_);
  if (base_ != nullptr || closed_) return;
  base_ = static_cast<char*>(slot);
  size_t n = std::min(slot_size / kPiece, kMaxPieces);
  for (size_t i = n; i-- > 0;) free_.push_back(static_cast<int>(i));
}

bool EagerStage::start(TxItem& item) {
  if (item.len == 0 || item.len > kPiece || !item.where.is_device()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (base_ == nullptr || closed_ || free_.empty()) return false;
  auto& q = queues_[(static_cast<int>(item.where.kind) << 16) | item.where.device];
  if (!q) {
    auto backend = backend_for(item.where);
    if (!backend.ok()) return false;
    auto made = (*backend)->create_queue();
    if (!made.ok()) {
      DMX_LOG_DEBUG("eager staging: no copy queue for {}: {}", to_string(item.where), made.status().message());
      return false;
    }
    q = std::move(*made);
  }
  int piece = free_.back();
  if (!q->to_host(base_ + static_cast<size_t>(piece) * kPiece, item.src, item.len).ok()) return false;
  auto fence = q->record();
  if (!fence.ok()) return false;  // the piece may still be written: it is not given back
  free_.pop_back();
  item.piece = piece;
  item.queue = q.get();
  item.fence = *fence;
  return true;
}

Status EagerStage::wait(const TxItem& item, Deadline deadline) {
  // Spins first: the copy of a few kilobytes ends within microseconds of its start.
  for (int polls = 0;; ++polls) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      DMX_ASSIGN_OR_RETURN(bool done, item.queue->done(item.fence));
      if (done) return Status();
    }
    if (deadline.expired())
      return Status(Code::kTimeout, fmt::format("the staging copy of an eager {} B device payload did not end in time",
                                                item.len));
    if (polls < 4096) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
}

const void* EagerStage::data(const TxItem& item) const {
  return base_ + static_cast<size_t>(item.piece) * kPiece;
}

void EagerStage::release(TxItem& item) {
  if (item.piece < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(item.piece);
  item.piece = -1;
}

void EagerStage::close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  for (auto& [key, q] : queues_) {
    auto fence = q->record();
    if (!fence.ok()) continue;
    Status s = q->wait(*fence, Deadline::after(std::chrono::seconds(30)));
    if (!s.ok()) DMX_LOG_ERROR("eager staging: copies did not finish while closing: {}", s.to_string());
  }
}

}  // namespace dmx::tcp
