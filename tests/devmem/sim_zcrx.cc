// SimNic's zcrx double: an io_uring zcrx ifq over a real TCP socket (see socket_double.h).
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "devmem/sim_state.h"

namespace dmx::devmem::testing {
namespace {

namespace za = zcrx_abi;

class SimZcrx final : public ZcrxKernel {
 public:
  SimZcrx(std::shared_ptr<SimNic::State> st, uint32_t queue, int sock, MemRegion memory, uint64_t base,
          uint32_t rq_entries)
      : st_(std::move(st)), queue_(queue), sock_(sock), mem_(memory), base_(base),
        cq_(size_t{st_->opt.zcrx_cq_entries} * za::kCqeSize), rqes_(rq_entries) {
    rings_.cq_head = &cq_head_;
    rings_.cq_tail = &cq_tail_;
    rings_.cq_mask = st_->opt.zcrx_cq_entries - 1;
    rings_.cqes = cq_.data();
    rings_.rq_head = &rq_head_;
    rings_.rq_tail = &rq_tail_;
    rings_.rq_mask = rq_entries - 1;
    rings_.rqes = rqes_.data();
    for (uint32_t p = 0; p < mem_.size / kPage; ++p) free_pages_.push_back(p);
    // A token like the kernel's: the area's id above IORING_ZCRX_AREA_SHIFT (one area: id 0 in
    // 6.18; a non-zero one here so that a consumer that drops it is caught).
    token_ = uint64_t{1} << za::kAreaShift;
  }
  ~SimZcrx() override {  // closing the ring: the queue is free, held buffers go back to the kernel
    std::lock_guard<std::mutex> lock(st_->mu);
    st_->nic.bound.erase(queue_);
    --st_->zcrx_ifqs;
    st_->zcrx_held -= held_.size();
  }

  ZcrxRings rings() override { return rings_; }
  uint64_t area_token() const override { return token_; }
  pollfd ready_fd() const override { return {sock_, POLLIN, 0}; }

  Status arm(uint64_t user_data) override {
    if (sock_ < 0 || ::fcntl(sock_, F_GETFD) < 0) return errno_status("io_uring_enter(RECV_ZC)", EBADF);
    if (armed_) return Status(Code::kInvalidArgument, "sim zcrx: a second multishot RECV_ZC on one socket");
    armed_ = true;
    tag_ = user_data;
    return Status();
  }

  Status wait(int timeout_ms) override {
    take_refills();
    if (deliver() == 0 && timeout_ms > 0 && armed_) {
      pollfd p{sock_, POLLIN, 0};
      ::poll(&p, 1, timeout_ms);  // without the lock: other sockets of this NIC go on
      take_refills();
      deliver();
    }
    return Status();
  }

 private:
  void take_refills() {
    std::lock_guard<std::mutex> lock(st_->mu);
    uint32_t tail = __atomic_load_n(&rq_tail_, __ATOMIC_ACQUIRE);
    for (; rq_head_ != tail; ++rq_head_) {
      za::Rqe r = rqes_[rq_head_ & rings_.rq_mask];
      auto it = held_.find(r.off & ~za::kAreaMask);
      if ((r.off & za::kAreaMask) != token_ || it == held_.end() || it->second != r.len) {
        ++st_->zcrx_bad_refills;  // io_zcrx_ring_refill skips it (a bug of the consumer)
        continue;
      }
      uint64_t page = (it->first - base_) / kPage;
      std::memset(static_cast<uint8_t*>(mem_.ptr) + page * kPage, 0xEE, kPage);  // reused at once
      free_pages_.push_back(static_cast<uint32_t>(page));
      held_.erase(it);
      --st_->zcrx_held;
      ++st_->zcrx_refilled;
    }
    __atomic_store_n(&rq_head_, rq_head_, __ATOMIC_RELEASE);
  }

  // Moves socket bytes into the area as CQEs while armed and room allows; returns the CQEs posted.
  size_t deliver() {
    std::lock_guard<std::mutex> lock(st_->mu);
    size_t posted = 0;
    std::uniform_int_distribution<uint32_t> page_off(0, kPage - 1);
    while (armed_ && cq_tail_ - __atomic_load_n(&cq_head_, __ATOMIC_ACQUIRE) <= rings_.cq_mask) {
      if (free_pages_.empty()) break;  // the NIC has no buffer: it stops (TCP retransmits later)
      uint8_t buf[kPage];
      uint32_t off = page_off(st_->rng);
      ssize_t n = ::recv(sock_, buf, kPage - off, MSG_PEEK | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n <= 0) {  // EOF, or the connection's error: the request ends
        post(tag_, n == 0 ? 0 : -errno, 0, 0);
        armed_ = false;
        ++posted;
        break;
      }
      std::uniform_int_distribution<size_t> pick(0, free_pages_.size() - 1);
      size_t i = pick(st_->rng);
      uint32_t page = free_pages_[i];
      free_pages_[i] = free_pages_.back();
      free_pages_.pop_back();
      std::memcpy(static_cast<uint8_t*>(mem_.ptr) + size_t{page} * kPage + off, buf, static_cast<size_t>(n));
      ssize_t c = ::recv(sock_, buf, static_cast<size_t>(n), MSG_DONTWAIT);  // its only reader: all there
      (void)c;
      uint64_t o = base_ + uint64_t{page} * kPage + off;
      held_[o] = static_cast<uint32_t>(n);
      ++st_->zcrx_held;
      bool more = !(st_->opt.zcrx_end_every && ++count_ % st_->opt.zcrx_end_every == 0);
      uint64_t user = tag_, zoff = token_ | o;
      int32_t res = static_cast<int32_t>(n);
      switch (std::exchange(st_->zcrx_fault, ZcrxFault::kNone)) {
        case ZcrxFault::kNone: break;
        case ZcrxFault::kUnknownArea: zoff = (uint64_t{9} << za::kAreaShift) | o; break;
        case ZcrxFault::kOutsideArea: zoff = token_ | (base_ + mem_.size + kPage); break;
        case ZcrxFault::kLongerThanArea: zoff = token_ | (base_ + mem_.size - 16); break;
        case ZcrxFault::kForeignTag: user = tag_ ^ 0x5a5a; break;
        case ZcrxFault::kErrorCqe: res = -EFAULT, more = false; break;
      }
      post(user, res, more ? za::kCqeFMore : 0, zoff);
      ++posted;
      if (!more) {
        armed_ = false;
        ++st_->zcrx_ends;
      }
    }
    return posted;
  }

  void post(uint64_t user_data, int32_t res, uint32_t flags, uint64_t off) {
    uint8_t* c = cq_.data() + size_t{cq_tail_ & rings_.cq_mask} * za::kCqeSize;
    io_uring_cqe e{};
    e.user_data = user_data;
    e.res = res;
    e.flags = flags;
    za::ZcrxCqe z{off, 0};
    std::memcpy(c, &e, sizeof e);
    std::memcpy(c + sizeof e, &z, sizeof z);
    __atomic_store_n(&cq_tail_, cq_tail_ + 1, __ATOMIC_RELEASE);
    ++st_->zcrx_cqes;
  }

  std::shared_ptr<SimNic::State> st_;
  uint32_t queue_;
  int sock_;
  MemRegion mem_;   // the memory of the dma-buf after `base_`
  uint64_t base_;   // area offset of mem_'s first byte
  uint64_t token_ = 0;
  std::vector<uint8_t> cq_;
  std::vector<za::Rqe> rqes_;
  uint32_t cq_head_ = 0, cq_tail_ = 0, rq_head_ = 0, rq_tail_ = 0;
  ZcrxRings rings_;
  std::vector<uint32_t> free_pages_;
  std::map<uint64_t, uint32_t> held_;  // area offset -> length of buffers the consumer holds
  bool armed_ = false;
  uint64_t tag_ = 0;
  size_t count_ = 0;
};

}  // namespace

Result<std::unique_ptr<ZcrxKernel>> open_sim_zcrx(std::shared_ptr<SimNic::State> st, int ifindex, uint32_t queue,
                                                  int sock_fd, int dmabuf_fd, uint64_t dmabuf_size,
                                                  uint32_t rq_entries) {
  auto refuse = [&](int e, std::string_view why) -> Status {
    return errno_status(fmt::format("sim IORING_REGISTER_ZCRX_IFQ(ifindex {}, queue {}): {}", ifindex, queue, why), e,
                        e == EEXIST || e == EOPNOTSUPP || e == ENODEV ? Code::kUnavailable : Code::kIo);
  };
  std::lock_guard<std::mutex> lock(st->mu);
  const SimNicOptions& o = st->opt;
  // io_uring_register, then io_register_zcrx_ifq (6.18), in their order.
  if (o.kernel_major < 6 || (o.kernel_major == 6 && o.kernel_minor < 15))
    return refuse(EINVAL, "refused (no such register opcode before Linux 6.15)");
  if (o.kernel_major == 6 && o.kernel_minor < 16)
    return refuse(EINVAL, "refused (IORING_ZCRX_AREA_DMABUF is an unknown area flag before Linux 6.16)");
  if (rq_entries == 0 || rq_entries > 32768) return refuse(EINVAL, "refused (rq_entries)");
  if (ifindex != st->nic.ifindex) return refuse(ENODEV, "no such interface");
  if (!st->nic.queue_api) return refuse(EOPNOTSUPP, "the driver has no queue API for memory providers");
  auto ex = st->exports.find(dmabuf_fd);  // io_zcrx_create_area -> dma_buf_get
  if (::fcntl(dmabuf_fd, F_GETFD) < 0) return refuse(EBADF, "the area fd is not open");
  if (ex == st->exports.end()) return refuse(EINVAL, "refused (the area fd is not a dma-buf)");
  MemRegion m = ex->second.memory;
  if (dmabuf_size != o.dmabuf_offset + m.size) return refuse(EINVAL, "refused (area len is not the dma-buf's length)");
  if (queue >= st->nic.rx_queues) return refuse(ERANGE, "rx queue idx out of range");  // __net_mp_open_rxq
  if (!st->nic.hds_on || st->nic.hds_thresh != 0) return refuse(EINVAL, "refused (tcp-data-split is disabled)");
  if (st->nic.bound.count(queue)) return refuse(EEXIST, "designated queue already memory provider bound");
  if (m.where.kind == MemKind::kCuda) return Status(Code::kInvalidArgument, "sim zcrx: host (and sim) memory only");
  uint32_t rq = 1;
  while (rq < rq_entries) rq <<= 1;  // the kernel rounds up to a power of two
  st->nic.bound.insert(queue);
  ++st->zcrx_ifqs;
  return std::unique_ptr<ZcrxKernel>(new SimZcrx(st, queue, sock_fd, m, o.dmabuf_offset, rq));
}

}  // namespace dmx::devmem::testing
