#include "transport/devmem/zcrx.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "core/sys.h"

namespace dmx::devmem {
namespace {

namespace za = zcrx_abi;

uint32_t load_acquire(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
void store_release(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

}  // namespace

// --- the receiver ------------------------------------------------------------------------------

Result<std::unique_ptr<ZcrxRx>> ZcrxRx::create(ZcrxKernel* kernel, MemRegion area, Gatherer* gatherer,
                                               ZcrxOptions options) {
  if (!kernel || !gatherer || area.size == 0) return Status(Code::kInvalidArgument, "zcrx rx: incomplete arguments");
  std::unique_ptr<ZcrxRx> rx(new ZcrxRx(kernel, area, gatherer, std::move(options)));
  rx->r_ = kernel->rings();
  if (!rx->r_.cq_head || !rx->r_.cq_tail || !rx->r_.cqes || !rx->r_.rq_head || !rx->r_.rq_tail || !rx->r_.rqes)
    return Status(Code::kInvalidArgument, "zcrx rx: rings not mapped");
  rx->token_ = kernel->area_token();
  if (rx->token_ & ~za::kAreaMask) return Status(Code::kProtocol, "zcrx rx: area token has offset bits set");
  rx->rq_tail_ = *rx->r_.rq_tail;
  if (rx->opt_.refill_batch == 0) rx->opt_.refill_batch = 1;
  return rx;
}

ZcrxRx::~ZcrxRx() {
  (void)reclaim(true, Deadline::after(std::chrono::seconds(5)));
  for (const auto& f : leftover_) ready_.push_back({token_ | f.off, f.len, 0});
  leftover_.clear();
  flush_refills();  // what does not fit now is freed by the kernel when the ifq goes
}

size_t ZcrxRx::buffers_held() const {
  size_t n = leftover_.size() + ready_.size();
  for (const auto& p : pending_) n += p.returns.size();
  return n;
}

Status ZcrxRx::fail(Status s) {
  if (!opt_.peer.empty()) s = s.with_peer(opt_.peer);
  s = s.with_origin("devmem/zcrx");
  DMX_LOG_ERROR("zcrx rx: {}", s.to_string());
  failed_ = s;
  return s;
}

Status ZcrxRx::drain_cqes(size_t* n) {
  *n = 0;
  uint32_t head = *r_.cq_head;
  uint32_t tail = load_acquire(r_.cq_tail);
  Status bad;
  for (; head != tail; ++head, ++*n) {
    const uint8_t* c = r_.cqes + size_t{head & r_.cq_mask} * za::kCqeSize;
    io_uring_cqe cqe;
    za::ZcrxCqe z;
    std::memcpy(&cqe, c, sizeof cqe);
    std::memcpy(&z, c + sizeof cqe, sizeof z);
    ++stats_.cqes;
    if (!(cqe.flags & za::kCqeFMore)) armed_ = false;  // the kernel ended the multishot
    if (!bad.ok()) continue;  // keep consuming, report the first problem
    if (cqe.user_data != kTag) {
      bad = Status(Code::kProtocol, fmt::format("zcrx: completion for unknown request {:#x}", cqe.user_data));
    } else if (cqe.res < 0) {
      bad = errno_status("IORING_OP_RECV_ZC", -cqe.res);
    } else if (cqe.res == 0) {
      eof_ = true;
    } else if ((z.off & za::kAreaMask) != token_) {
      bad = Status(Code::kProtocol, fmt::format("zcrx: buffer of unknown area {:#x} (ours is {:#x})",
                                                z.off & za::kAreaMask, token_));
    } else {
      uint64_t off = z.off & ~za::kAreaMask;
      auto len = static_cast<uint64_t>(cqe.res);
      uint64_t base = opt_.area_base;
      if (off < base || off - base > area_.size || len > area_.size - (off - base) || len > (1u << 31))
        bad = Status(Code::kOutOfRange, fmt::format("zcrx: buffer [{}, +{}) outside our {} bytes at {} of the area",
                                                    off, len, area_.size, base));
      else
        leftover_.push_back({off, static_cast<uint32_t>(len), 0}), stats_.bytes += len;
    }
  }
  store_release(r_.cq_head, head);
  return bad;
}

Status ZcrxRx::reclaim(bool all, Deadline deadline) {
  while (!pending_.empty()) {
    Pending& p = pending_.front();
    if (all) {
      DMX_RETURN_IF_ERROR(g_->wait(p.fence, deadline));
    } else {
      DMX_ASSIGN_OR_RETURN(bool done, g_->done(p.fence));
      if (!done) break;
    }
    ready_.insert(ready_.end(), p.returns.begin(), p.returns.end());
    pending_.pop_front();
  }
  if (ready_.size() >= opt_.refill_batch) flush_refills();
  return Status();
}

void ZcrxRx::flush_refills() {
  uint32_t entries = r_.rq_mask + 1;
  size_t posted = 0;
  while (posted < ready_.size() && rq_tail_ - load_acquire(r_.rq_head) < entries) {
    r_.rqes[rq_tail_ & r_.rq_mask] = ready_[posted++];
    ++rq_tail_;
  }
  if (posted == 0) return;
  store_release(r_.rq_tail, rq_tail_);
  ready_.erase(ready_.begin(), ready_.begin() + static_cast<long>(posted));
  stats_.refills += posted;
  ++stats_.refill_flushes;
}

size_t ZcrxRx::take(MemRegion dst, size_t* got) {
  std::vector<Fragment> frags;
  Pending p{0, {}};
  while (!leftover_.empty() && *got < dst.size) {
    Frag& f = leftover_.front();
    auto n = static_cast<uint32_t>(std::min<uint64_t>(f.len - f.used, dst.size - *got));
    frags.push_back({f.off - opt_.area_base + f.used, *got, n});
    *got += n;
    f.used += n;
    if (f.used == f.len) {
      p.returns.push_back({token_ | f.off, f.len, 0});
      leftover_.pop_front();
    }
  }
  if (frags.empty()) return 0;
  auto fence = g_->enqueue(area_, frags, nullptr, {}, dst);
  if (!fence.ok()) {
    // The buffers are ours to give back even so; the failure is the caller's to report.
    ready_.insert(ready_.end(), p.returns.begin(), p.returns.end());
    failed_ = fence.status();
    return frags.size();
  }
  ++stats_.gathers;
  p.fence = *fence;
  pending_.push_back(std::move(p));
  return frags.size();
}

Status ZcrxRx::receive_some(MemRegion dst, size_t* got, Deadline deadline) {
  if (!failed_.ok()) return failed_;
  for (int pass = 0; pass < 2 && *got < dst.size; ++pass) {
    take(dst, got);  // what arrived earlier (bytes beyond a previous destination)
    if (!failed_.ok()) return fail(failed_);
    if (Status s = reclaim(false, deadline); !s.ok()) return fail(std::move(s));
    if (*got == dst.size) break;
    size_t n = 0;
    if (Status s = drain_cqes(&n); !s.ok()) return fail(std::move(s));
    if (n > 0) continue;
    if (eof_)
      return fail(Status(Code::kClosed, fmt::format("peer closed the connection after {} of {} bytes", *got, dst.size)));
    if (!armed_) {
      if (Status s = k_->arm(kTag); !s.ok()) return fail(std::move(s));
      armed_ = true;
      ++stats_.rearms;
    }
    flush_refills();  // the NIC may be waiting for buffers: never idle on refills we hold
    if (pass == 0)
      if (Status s = k_->wait(0); !s.ok()) return fail(std::move(s));  // run the kernel's pending work
  }
  if (*got < dst.size) flush_refills();
  return Status();
}

Status ZcrxRx::finish(Deadline deadline) {
  if (!failed_.ok()) return failed_;
  // Completion contract: dst holds the bytes; its buffers are back (or queued to go back).
  if (Status s = reclaim(true, deadline); !s.ok()) return fail(std::move(s));
  flush_refills();
  return Status();
}

Result<uint64_t> ZcrxRx::unclaimed() {
  if (!failed_.ok()) return failed_;
  size_t n = 0;
  if (Status s = drain_cqes(&n); !s.ok()) return fail(std::move(s));
  uint64_t bytes = 0;
  for (const auto& f : leftover_) bytes += f.len - f.used;
  return bytes;
}

Status ZcrxRx::receive(MemRegion dst, Deadline deadline) {
  size_t got = 0;
  while (got < dst.size) {
    size_t before = got;
    DMX_RETURN_IF_ERROR(receive_some(dst, &got, deadline));
    if (got > before) continue;
    if (deadline.expired())
      return fail(Status(Code::kTimeout, fmt::format("zcrx receive: {} of {} bytes by the deadline", got, dst.size)));
    int ms = deadline.poll_timeout_ms();
    if (Status s = k_->wait(ms < 0 ? 100 : std::min(ms, 100)); !s.ok()) return fail(std::move(s));
  }
  return finish(deadline);
}

}  // namespace dmx::devmem
