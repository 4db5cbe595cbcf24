// devmem TCP receive: recvmsg(MSG_SOCK_DEVMEM) -> validated fragments -> gather -> tokens back.
//
// Lifecycle of received fragments (per recvmsg call):
//   parsed      cmsgs checked (binding id, bounds, sizes, token range); every token recorded
//   gathering   copies enqueued on the Gatherer, fence known
//   returned    fence complete -> tokens given back with SO_DEVMEM_DONTNEED (batched)
// On any error the connection's receive side fails (sticky), outstanding gathers are waited for
// (bounded) and every token is returned: tokens never leak, and the kernel frees the rest when
// the socket closes anyway.
//
// Thread-safety: one owner thread (the connection's progress thread). The pool memory, the
// binding and the socket must outlive the DevmemRx.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "core/clock.h"
#include "dmx/memory.h"
#include "dmx/status.h"
#include "transport/devmem/gather.h"
#include "transport/devmem/kernel.h"
#include "transport/devmem/tokens.h"

namespace dmx {
class Config;
}

namespace dmx::devmem {

// The RX dmabuf as bound: fragments must carry this binding id and lie inside `memory`, which
// starts at `dmabuf_offset` within the dmabuf.
struct RxPool {
  uint32_t dmabuf_id = 0;
  uint64_t dmabuf_offset = 0;
  MemRegion memory;
};

struct ParsedRecv {
  std::vector<Fragment> frags;
  std::vector<LinearChunk> linear;
  std::vector<uint32_t> tokens;  // every token seen, valid or not: all of them must go back
  uint64_t bytes = 0;
  bool plain = false;  // no devmem cmsgs at all: ordinary TCP data in the host iov (steering miss)
};

// Parses the control messages of one recvmsg that returned `ret` bytes after asking for
// `requested`; `dst_offset` is where this call's first byte goes. Tokens are recorded into `out`
// even when an error is returned. Pure; exposed for tests.
Status parse_recv(const msghdr& msg, size_t ret, size_t requested, const RxPool& pool, uint64_t dst_offset,
                  ParsedRecv* out);

struct RxOptions {
  size_t recv_chunk = 1 << 20;          // bytes asked per recvmsg (and host linear buffer size)
  size_t control_size = 64 << 10;       // initial msg_control size; grows (x2) on ETOOSMALL
  size_t control_max = 4 << 20;         // ... up to this
  size_t max_outstanding_frags = 16384; // tokens held before waiting for the oldest gather
  // Kernels before 6.14 (no put_cmsg_notrunc) answer EFAULT where later ones say ETOOSMALL: there
  // EFAULT grows the control buffer like ETOOSMALL, and is fatal only at control_max.
  bool efault_may_mean_small_control = false;
  std::string peer;                     // named in errors
};

// RxOptions from the devmem_* rows of the configuration table (and the running kernel's version).
RxOptions rx_options(const Config& config);

struct RxStats {
  uint64_t recv_calls = 0;
  uint64_t devmem_bytes = 0;   // payload that landed in the bound device memory
  uint64_t linear_bytes = 0;   // payload that landed in host memory (copied to the destination)
  uint64_t plain_calls = 0;    // recvmsg calls with no devmem cmsgs (flow not steered)
  uint64_t frags = 0;
  uint64_t linear_chunks = 0;  // SCM_DEVMEM_LINEAR chunks (and plain calls) copied from the host iov
  uint64_t gathers = 0;
  uint64_t control_grows = 0;  // ETOOSMALL answers
  TokenStats tokens;
};

class DevmemRx {
 public:
  static Result<std::unique_ptr<DevmemRx>> create(KernelSocket* sock, RxPool pool, Gatherer* gatherer,
                                                   RxOptions options);
  ~DevmemRx();
  DevmemRx(const DevmemRx&) = delete;
  DevmemRx& operator=(const DevmemRx&) = delete;

  // Receives exactly dst.size bytes of the stream into dst. When it returns ok, the bytes are in
  // dst (gathers complete) and every token is back with the kernel.
  Status receive(MemRegion dst, Deadline deadline);

  // The same, in steps, for a progress loop that also does other things (the engine's devmem
  // path): one non-blocking recvmsg into dst at *got (asking at most dst.size - *got bytes), its
  // gather enqueued and *got advanced. Ok with *got unchanged when nothing was ready (EAGAIN; poll
  // the socket for POLLIN). Waits on the device only (bounded by `device_deadline`): for the
  // oldest gather when max_outstanding_frags tokens are held, and for the linear buffer's last
  // gather. Errors are sticky, as for receive(); a peer that closed is kClosed.
  Status receive_some(MemRegion dst, size_t* got, Deadline device_deadline);
  // Once receive_some brought *got to dst.size: waits for the gathers and returns every token
  // (the completion contract of receive()).
  Status finish(Deadline deadline);

  // Called when the socket turns readable while no receive is posted: the peer sent more than
  // it announced. Consumes what is there, returns its tokens, and fails the receive side.
  Status reject_unexpected();
  ssize_t recv_devmem(msghdr* msg, iovec* iov);

  const RxStats& stats() const { return stats_; }
  uint64_t outstanding_tokens() const { return outstanding_; }
  const Status& error() const { return failed_; }

 private:
  struct Pending {
    uint64_t fence;
    std::vector<uint32_t> tokens;
  };
  DevmemRx(KernelSocket* sock, RxPool pool, Gatherer* gatherer, RxOptions options);
  // One recvmsg step; *would_block when the socket had nothing (else *got may be unchanged after
  // an ETOOSMALL that grew the control buffer).
  Status step(MemRegion dst, size_t* got, Deadline deadline, bool* would_block);
  Status reclaim(bool wait_all, Deadline deadline);  // returns tokens of finished gathers
  Status fail(Status s);
  Status release_everything();  // waits (bounded) and returns all tokens

  KernelSocket* sock_;
  RxPool pool_;
  Gatherer* gatherer_;
  RxOptions opt_;
  std::vector<uint8_t> control_;
  uint8_t* linear_ = nullptr;
  uint64_t linear_fence_ = 0;  // the last fence reading linear_
  std::deque<Pending> pending_;
  uint64_t outstanding_ = 0;
  RxStats stats_;
  Status failed_;
};

}  // namespace dmx::devmem
