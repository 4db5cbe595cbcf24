// The real kernel side of zcrx (zcrx.h): io_uring set-up, IFQ registration, RECV_ZC, and the probe.
#include <fmt/format.h>
#include <linux/time_types.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/sys.h"
#include "transport/devmem/kernel.h"
#include "transport/devmem/zcrx.h"

namespace dmx::devmem {
namespace {

namespace za = zcrx_abi;

void store_release(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

}  // namespace

namespace {

int sys_setup(unsigned entries, io_uring_params* p) {
  return static_cast<int>(::syscall(__NR_io_uring_setup, entries, p));
}
int sys_register(int fd, unsigned op, void* arg, unsigned n) {
  return static_cast<int>(::syscall(__NR_io_uring_register, fd, op, arg, n));
}
int sys_enter(int fd, unsigned submit, unsigned min_complete, unsigned flags, const void* arg, size_t argsz) {
  return static_cast<int>(::syscall(__NR_io_uring_enter, fd, submit, min_complete, flags, arg, argsz));
}

struct Mapping {
  void* p = MAP_FAILED;
  size_t n = 0;
  ~Mapping() {
    if (p != MAP_FAILED) ::munmap(p, n);
  }
};

// What an errno from IORING_REGISTER_ZCRX_IFQ means (io_uring/zcrx.c, 6.18).
std::string register_reason(int e) {
  switch (e) {
    case EPERM: return "needs CAP_NET_ADMIN";
    case ENODEV: return "no such interface";
    case EOPNOTSUPP: return "the driver has no queue API for memory providers (or no DMA device)";
    case EEXIST: return "the queue is already bound to a memory provider (devmem, zcrx) or XDP";
    case EINVAL: return "refused (a kernel before 6.15 without zcrx, before 6.16 without dma-buf areas, header split "
                        "off, or an area that is not a dma-buf)";
    default: return "refused";
  }
}

class KernelZcrx final : public ZcrxKernel {
 public:
  ~KernelZcrx() override = default;  // the mappings, then the ring fd: closing it unregisters

  static Result<std::unique_ptr<KernelZcrx>> open(int ifindex, uint32_t queue, int sock, int dmabuf_fd,
                                                  uint64_t dmabuf_size, uint32_t rq_entries) {
    auto k = std::unique_ptr<KernelZcrx>(new KernelZcrx());
    k->sock_ = sock;
    io_uring_params p{};
    // Created disabled: the thread that enables it (the first arm()/wait(), the path's own thread)
    // becomes its single issuer, the only one that may submit and run its task work.
    p.flags = za::kSetupSingleIssuer | za::kSetupDeferTaskrun | za::kSetupCqe32 | za::kSetupRDisabled;
    int fd = sys_setup(64, &p);
    if (fd < 0)
      return errno_status("io_uring_setup(SINGLE_ISSUER | DEFER_TASKRUN | CQE32 | R_DISABLED)", errno,
                          Code::kUnavailable);
    k->fd_.reset(fd);
    if (!(p.features & za::kFeatSingleMmap)) return Status(Code::kUnavailable, "io_uring without IORING_FEAT_SINGLE_MMAP");
    size_t sq_sz = p.sq_off.array + p.sq_entries * sizeof(uint32_t);
    size_t cq_sz = p.cq_off.cqes + p.cq_entries * za::kCqeSize;
    k->ring_.n = std::max(sq_sz, cq_sz);
    k->ring_.p = ::mmap(nullptr, k->ring_.n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, za::kOffSqRing);
    if (k->ring_.p == MAP_FAILED) return errno_status("mmap(io_uring rings)", errno);
    k->sqes_.n = p.sq_entries * za::kSqeSize;
    k->sqes_.p = ::mmap(nullptr, k->sqes_.n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, za::kOffSqes);
    if (k->sqes_.p == MAP_FAILED) return errno_status("mmap(io_uring sqes)", errno);
    auto* base = static_cast<uint8_t*>(k->ring_.p);
    k->sq_tail_ = reinterpret_cast<uint32_t*>(base + p.sq_off.tail);
    k->sq_mask_ = *reinterpret_cast<uint32_t*>(base + p.sq_off.ring_mask);
    k->sq_array_ = reinterpret_cast<uint32_t*>(base + p.sq_off.array);
    k->rings_.cq_head = reinterpret_cast<uint32_t*>(base + p.cq_off.head);
    k->rings_.cq_tail = reinterpret_cast<uint32_t*>(base + p.cq_off.tail);
    k->rings_.cq_mask = *reinterpret_cast<uint32_t*>(base + p.cq_off.ring_mask);
    k->rings_.cqes = base + p.cq_off.cqes;

    // The refill ring lives in memory we provide (IORING_MEM_REGION_TYPE_USER).
    size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    k->refill_.n = (4096 + size_t{rq_entries} * sizeof(za::Rqe) + page - 1) / page * page;
    k->refill_.p = ::mmap(nullptr, k->refill_.n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (k->refill_.p == MAP_FAILED) return errno_status("mmap(zcrx refill ring)", errno);
    za::RegionDesc region{};
    region.user_addr = reinterpret_cast<uintptr_t>(k->refill_.p);
    region.size = k->refill_.n;
    region.flags = za::kMemRegionTypeUser;
    za::AreaReg area{};
    area.len = dmabuf_size;
    area.flags = za::kAreaDmabuf;
    area.dmabuf_fd = static_cast<uint32_t>(dmabuf_fd);
    za::IfqReg reg{};
    reg.if_idx = static_cast<uint32_t>(ifindex);
    reg.if_rxq = queue;
    reg.rq_entries = rq_entries;
    reg.area_ptr = reinterpret_cast<uintptr_t>(&area);
    reg.region_ptr = reinterpret_cast<uintptr_t>(&region);
    if (sys_register(fd, za::kRegisterZcrxIfq, &reg, 1) < 0) {
      int e = errno;
      return errno_status(fmt::format("IORING_REGISTER_ZCRX_IFQ(ifindex {}, queue {}, dma-buf area of {} bytes): {}",
                                      ifindex, queue, dmabuf_size, register_reason(e)),
                          e, e == EPERM || e == EOPNOTSUPP || e == EEXIST || e == ENODEV ? Code::kUnavailable : Code::kIo);
    }
    auto* rb = static_cast<uint8_t*>(k->refill_.p);
    if (reg.rq_entries == 0 || (reg.rq_entries & (reg.rq_entries - 1)) ||
        reg.offsets.rqes + size_t{reg.rq_entries} * sizeof(za::Rqe) > k->refill_.n ||
        reg.offsets.head + 4 > k->refill_.n || reg.offsets.tail + 4 > k->refill_.n)
      return Status(Code::kProtocol, "IORING_REGISTER_ZCRX_IFQ: refill ring offsets outside the region");
    k->rings_.rq_head = reinterpret_cast<uint32_t*>(rb + reg.offsets.head);
    k->rings_.rq_tail = reinterpret_cast<uint32_t*>(rb + reg.offsets.tail);
    k->rings_.rqes = reinterpret_cast<za::Rqe*>(rb + reg.offsets.rqes);
    k->rings_.rq_mask = reg.rq_entries - 1;
    k->token_ = area.rq_area_token;
    k->zcrx_id_ = reg.zcrx_id;
    // With DEFER_TASKRUN nothing runs until we enter the ring; the eventfd says when to.
    k->evfd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!k->evfd_.valid()) return errno_status("eventfd(zcrx)", errno);
    int efd = k->evfd_.get();
    if (sys_register(fd, za::kRegisterEventfd, &efd, 1) < 0) return errno_status("IORING_REGISTER_EVENTFD", errno);
    return k;
  }

  ZcrxRings rings() override { return rings_; }
  uint64_t area_token() const override { return token_; }

  Status arm(uint64_t user_data) override {
    DMX_RETURN_IF_ERROR(enable());
    uint32_t tail = *sq_tail_;
    uint32_t idx = tail & sq_mask_;
    auto* sqe = static_cast<uint8_t*>(sqes_.p) + size_t{idx} * za::kSqeSize;
    std::memset(sqe, 0, za::kSqeSize);
    io_uring_sqe s{};
    s.opcode = za::kOpRecvZc;
    s.fd = sock_;
    s.ioprio = za::kRecvMultishot;
    s.user_data = user_data;
    std::memcpy(sqe, &s, sizeof s);
    std::memcpy(sqe + za::kSqeZcrxIfqIdx, &zcrx_id_, sizeof zcrx_id_);
    sq_array_[idx] = idx;
    store_release(sq_tail_, tail + 1);
    if (sys_enter(fd_.get(), 1, 0, 0, nullptr, 0) < 0) return errno_status("io_uring_enter(RECV_ZC)", errno);
    return Status();
  }

  Status wait(int timeout_ms) override {
    DMX_RETURN_IF_ERROR(enable());
    uint64_t v;
    while (::read(evfd_.get(), &v, sizeof v) > 0) {
    }
    __kernel_timespec ts{timeout_ms / 1000, static_cast<long long>(timeout_ms % 1000) * 1000000};
    io_uring_getevents_arg arg{};
    arg.ts = reinterpret_cast<uintptr_t>(&ts);
    if (sys_enter(fd_.get(), 0, 1, za::kEnterGetevents | za::kEnterExtArg, &arg, sizeof arg) < 0 && errno != ETIME &&
        errno != EINTR)
      return errno_status("io_uring_enter(GETEVENTS)", errno);
    return Status();
  }

  pollfd ready_fd() const override { return {evfd_.get(), POLLIN, 0}; }

 private:
  KernelZcrx() = default;
  Status enable() {
    if (enabled_) return Status();
    if (sys_register(fd_.get(), za::kRegisterEnableRings, nullptr, 0) < 0)
      return errno_status("IORING_REGISTER_ENABLE_RINGS", errno);
    enabled_ = true;
    return Status();
  }
  UniqueFd fd_;
  UniqueFd evfd_;
  bool enabled_ = false;
  Mapping ring_, sqes_, refill_;  // unmapped before fd_ closes (declared after it)
  int sock_ = -1;
  uint32_t* sq_tail_ = nullptr;
  uint32_t sq_mask_ = 0;
  uint32_t* sq_array_ = nullptr;
  ZcrxRings rings_;
  uint64_t token_ = 0;
  uint32_t zcrx_id_ = 0;
};

}  // namespace

Result<std::unique_ptr<ZcrxKernel>> open_kernel_zcrx(int ifindex, uint32_t queue, int sock_fd, int dmabuf_fd,
                                                     uint64_t dmabuf_size, uint32_t rq_entries) {
  auto k = KernelZcrx::open(ifindex, queue, sock_fd, dmabuf_fd, dmabuf_size, rq_entries);
  if (!k.ok()) return k.status();
  return std::unique_ptr<ZcrxKernel>(std::move(*k));
}

Capability probe_zcrx(const std::string& ifname, int ifindex, uint32_t queue, const Capability& bind_rx) {
  std::string name = fmt::format("devmem.zcrx[{}]", ifname);
  if (running_kernel_before(6, 15)) return {name, false, "the kernel has no io_uring zcrx (needs Linux 6.15)"};
  if (running_kernel_before(6, 16)) return {name, false, "the kernel's zcrx has no dma-buf areas (needs Linux 6.16)"};
  // A memfd where the dma-buf belongs: the registration is refused at the dma-buf import, after the
  // privilege, ring-flag and device checks and before any queue is touched.
  UniqueFd memfd(::memfd_create("dmx-zcrx-probe", MFD_CLOEXEC));
  if (!memfd.valid()) return {name, false, errno_status("memfd_create", errno).message()};
  auto k = open_kernel_zcrx(ifindex, queue, -1, memfd.get(), 1 << 20, 64);
  if (k.ok()) return {name, false, "the kernel registered a memfd as a dma-buf area: unexpected kernel"};
  const std::string& m = k.status().message();
  bool reached_import = m.find("(errno 22)") != std::string::npos && m.find("IORING_REGISTER_ZCRX_IFQ") != std::string::npos;
  if (!reached_import) return {name, false, m};
  // Past the import, zcrx opens the queue as devmem does: the queue API verdict is bind-rx's.
  if (!bind_rx.available)
    return {name, false, fmt::format("the registration reached the dma-buf import (probe memfd refused, EINVAL); "
                                     "the queue itself is refused as for devmem RX: {}", bind_rx.detail)};
  return {name, true, fmt::format("ring flags and registration accepted up to the dma-buf import (probe memfd "
                                  "refused, EINVAL); the driver has the queue API ({})", bind_rx.name)};
}

}  // namespace dmx::devmem
