// io_uring zero-copy receive (zcrx): a second receiver for device memory, beside devmem RX.
//
// One NIC RX queue is registered with an io_uring (IORING_REGISTER_ZCRX_IFQ) together with an
// "area": here a dma-buf of the RX pool (GPU memory; 6.16+). A multishot IORING_OP_RECV_ZC on the
// data socket then posts one CQE32 per received buffer: res = bytes, and the second half holds
// the area token | offset where the NIC put them. Buffers go back to the kernel through a refill
// ring in shared memory (io_uring_zcrx_rqe {off, len}), in batches, with no system call per
// buffer (devmem needs SO_DEVMEM_DONTNEED). Same NIC needs as devmem RX (header split, flow
// steering, the driver's queue API: both use net_mp_open_rxq); the socket must be steered to
// the registered queue.
//
// ZcrxRx is the logic (validate each CQE, gather into the destination, give buffers back only
// after the gather finished, re-arm the multishot when the kernel ends it, flush refills before
// every wait so the NIC never starves); ZcrxKernel is the seam: the real io_uring
// (open_kernel_zcrx) or a test double that fills the rings as the kernel does. Errors are sticky.
// Thread-safety: one owner thread.
#pragma once

#include <poll.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "core/capability.h"
#include "core/clock.h"
#include "dmx/memory.h"
#include "dmx/status.h"
#include "transport/devmem/gather.h"
#include "transport/devmem/zcrx_abi.h"

namespace dmx::devmem {

// The rings zcrx shares with the kernel. The consumer owns cq_head and rq_tail; the kernel
// cq_tail and rq_head (acquire/release on each side).
struct ZcrxRings {
  uint32_t* cq_head = nullptr;
  const uint32_t* cq_tail = nullptr;
  uint32_t cq_mask = 0;
  const uint8_t* cqes = nullptr;  // zcrx_abi::kCqeSize bytes each
  const uint32_t* rq_head = nullptr;
  uint32_t* rq_tail = nullptr;
  uint32_t rq_mask = 0;
  zcrx_abi::Rqe* rqes = nullptr;
};

class ZcrxKernel {
 public:
  virtual ~ZcrxKernel() = default;
  virtual ZcrxRings rings() = 0;
  virtual uint64_t area_token() const = 0;  // rq_area_token of the registered area
  // Submits a multishot RECV_ZC on the data socket, tagged `user_data`.
  virtual Status arm(uint64_t user_data) = 0;
  // Lets the kernel post completions (io_uring_enter GETEVENTS), waiting up to timeout_ms for one
  // (0: only run what is pending). The first arm() or wait() comes from the thread that owns the
  // ring from then on (SINGLE_ISSUER: the real ring is created disabled and enabled there).
  virtual Status wait(int timeout_ms) = 0;
  // What to poll(2) for "completions may be ready; call wait(0)": the real ring's eventfd
  // (IORING_REGISTER_EVENTFD; signalled when deferred task work is queued and when CQEs post).
  virtual pollfd ready_fd() const = 0;
};

// The real one: an io_uring (SINGLE_ISSUER | DEFER_TASKRUN | CQE32) with queue `queue` of
// `ifindex` registered over the dma-buf `dmabuf_fd` (`dmabuf_size` bytes), receiving on `sock_fd`.
// The kernel's errno comes back verbatim, with what it means for zcrx.
Result<std::unique_ptr<ZcrxKernel>> open_kernel_zcrx(int ifindex, uint32_t queue, int sock_fd, int dmabuf_fd,
                                                     uint64_t dmabuf_size, uint32_t rq_entries = 4096);

struct ZcrxOptions {
  size_t refill_batch = 64;  // refills posted together (always flushed before a wait)
  std::string peer;          // named in errors
  // Area offsets of our memory start here: area offset o is area-memory byte o - area_base; a
  // buffer the kernel places before it is refused (the path asks for 0: a dma-buf that begins at
  // its memory).
  uint64_t area_base = 0;
};

struct ZcrxStats {
  uint64_t cqes = 0, bytes = 0, gathers = 0;
  uint64_t refills = 0;        // buffers given back
  uint64_t refill_flushes = 0; // tail updates that gave some back
  uint64_t rearms = 0;         // multishot RECV_ZC submitted again after the kernel ended one
};

class ZcrxRx {
 public:
  // `area` is the memory the registered area maps (area offsets index into it).
  static Result<std::unique_ptr<ZcrxRx>> create(ZcrxKernel* kernel, MemRegion area, Gatherer* gatherer,
                                                ZcrxOptions options);
  ~ZcrxRx();  // waits (bounded) for gathers, gives every buffer back

  // Receives exactly dst.size bytes into dst (bytes beyond it stay for the next call).
  Status receive(MemRegion dst, Deadline deadline);
  // The same without waiting, for a poll loop: gathers what has arrived into dst from *got on
  // (advancing *got), lets the kernel post what is pending, re-arms and gives buffers back; returns
  // with *got unchanged when nothing is there (then poll kernel->ready_fd()). When *got reached
  // dst.size, finish() waits for the gathers.
  Status receive_some(MemRegion dst, size_t* got, Deadline deadline);
  Status finish(Deadline deadline);
  // Bytes received that no receive has claimed yet (completions drained first).
  Result<uint64_t> unclaimed();
  const ZcrxStats& stats() const { return stats_; }
  size_t buffers_held() const;  // received buffers not yet given back
  const Status& error() const { return failed_; }

 private:
  struct Frag {
    uint64_t off;  // offset in the area
    uint32_t len, used;
  };
  struct Pending {
    uint64_t fence;
    std::vector<zcrx_abi::Rqe> returns;
  };
  ZcrxRx(ZcrxKernel* k, MemRegion area, Gatherer* g, ZcrxOptions o) : k_(k), area_(area), g_(g), opt_(std::move(o)) {}
  Status fail(Status s);
  Status drain_cqes(size_t* n);
  size_t take(MemRegion dst, size_t* got);  // leftover buffers -> one gather into dst
  Status reclaim(bool all, Deadline deadline);
  void flush_refills();

  static constexpr uint64_t kTag = 0x7a637278;  // "zcrx"
  ZcrxKernel* k_;
  MemRegion area_;
  Gatherer* g_;
  ZcrxOptions opt_;
  ZcrxRings r_;
  uint64_t token_ = 0;
  uint32_t rq_tail_ = 0;
  bool armed_ = false, eof_ = false;
  std::deque<Frag> leftover_;
  std::deque<Pending> pending_;
  std::vector<zcrx_abi::Rqe> ready_;
  ZcrxStats stats_;
  Status failed_;
};

// `devmem.zcrx[IF]`: whether zcrx can receive through `ifname`: the kernel (6.15; dma-buf areas
// 6.16), an io_uring with the flags zcrx needs, a registration attempt with a memfd where a dma-buf
// belongs (non-destructive: refused at the dma-buf import, before any queue is touched), and the
// driver's queue API, which zcrx shares with devmem RX (`bind_rx`, the devmem probe's verdict).
Capability probe_zcrx(const std::string& ifname, int ifindex, uint32_t queue, const Capability& bind_rx);

}  // namespace dmx::devmem
