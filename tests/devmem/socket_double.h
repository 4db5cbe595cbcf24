// A devmem TCP double over a REAL connected TCP socket, so that real bytes move end to end on a
// machine without a devmem NIC (the engine's devmem path is tested through it).
//
// One SimNic stands for one host's devmem NIC and kernel side. It provides every HostSeams seam:
//  - exporter: a memfd stand-in for the dmabuf of host memory (the pool and ring of the path);
//    the "dmabuf" starts kDmabufOffset bytes before the memory, so offsets are really translated;
//  - netlink: bind-rx / bind-tx of those stand-ins, by fd, with the kernel's checks in its order
//    (BindModel: EINVAL for a file that is not one of them, EEXIST for a queue already bound);
//    ids from 7 up; unbinding (and freeing the queues) on destruction;
//  - socket(fd): a KernelSocket over the connected TCP socket `fd`:
//      TX  sendmsg(MSG_ZEROCOPY, SCM_DEVMEM_DMABUF id, iov_base = dmabuf offset) checks what 6.18
//          checks (zerocopy on, a TX binding's id, the socket's route through the NIC — it is,
//          until SO_BINDTODEVICE on the connected socket resets it — offsets inside),
//          reads the bytes from the TX-bound memory ("the NIC's DMA") and writes them to the real
//          socket (partial writes and EAGAIN as the socket gives them). Each sendmsg that queued
//          bytes takes the next zerocopy id; completions reach the error queue later, at random
//          (a reader of MSG_ERRQUEUE sees them about every other call), coalesced into [lo, hi]
//          ranges. At completion the double checks that the sent region still holds what was sent
//          (a source reused before its completion is counted in reused_before_completion);
//      RX  recvmsg(MSG_SOCK_DEVMEM) peeks the real socket, cuts the bytes into "packets" of random
//          sizes, and places each packet as <= 4 KiB fragments at random offsets of random free
//          4 KiB pages of the RX-bound memory (one page per fragment, held until its token is
//          returned, scribbled when freed), or, with probability linear_fraction, copies it into
//          the iov as an SCM_DEVMEM_LINEAR chunk; then consumes exactly the bytes it described. A
//          full control buffer ends the call (ETOOSMALL when nothing fitted); a full page pool
//          ends it too (EAGAIN when nothing fitted: a NIC would drop and TCP retransmit).
//          SO_DEVMEM_DONTNEED frees tokens like sock_devmem_dontneed (returns a count, skips
//          unknown ones, which are counted here as unknown_returns: a double return or a made-up
//          token is a bug of the caller).
// Fault injection (next fragment delivered by any socket of this SimNic): an unknown dmabuf id,
// an offset outside the bound buffer, a token beyond 31 bits (the real token is then held until
// "close", as the kernel would), a plain (non-devmem) call.
//
// zcrx (options.zcrx; sim_zcrx.cc): seams().zcrx registers an io_uring zcrx ifq as 6.18's
// io_register_zcrx_ifq does, in its order: EINVAL on kernels before 6.15 (no such register
// opcode) and 6.15 (no dma-buf areas), ENODEV (ifindex), EOPNOTSUPP (no queue API), EBADF/EINVAL
// (the fd is not one of this NIC's dma-bufs, or the area length is not the dma-buf's), ERANGE
// (queue id), EINVAL (header split), EEXIST (the queue has a memory provider: a devmem binding or
// another ifq). The area is the whole dma-buf. While a multishot RECV_ZC is armed, wait() takes
// the refill ring (each entry checked against the buffers handed out; a freed buffer's page is
// scribbled), then peeks the real socket and places the bytes as buffers of <= 4 KiB at random
// offsets of free pages, one CQE32 each (token | offset), until the CQ or the area is full; ends
// the multishot now and then (no F_MORE), as the kernel does when its CQ overflows; 0 bytes and no
// F_MORE at EOF. ready_fd() is the socket's POLLIN.
// Thread-safety: every call locks the SimNic's state; accounting may be read from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/devmem/devmem.h"
#include "transport/devmem/kernel.h"

namespace dmx::devmem::testing {

struct SimNicOptions {
  std::string ifname = "simdev0";
  uint64_t seed = 1;
  uint32_t min_packet = 512;     // packet payload sizes, uniformly in [min_packet, max_packet]
  uint32_t max_packet = 9000;
  double linear_fraction = 0.02; // packets whose payload lands in the linear (host) area
  size_t max_send = 256 << 10;   // bytes one sendmsg hands to the socket at most (partial sends)
  uint64_t dmabuf_offset = 8192; // where exported memory starts in its "dma-buf"
  bool zcrx = false;             // seams() offers zcrx (the double below)
  int kernel_major = 6, kernel_minor = 18;  // the kernel the zcrx double answers as
  uint32_t zcrx_cq_entries = 128;
  uint32_t zcrx_end_every = 97;  // every n-th CQE ends the multishot (0: never)
  // The gatherer writes host and pinned memory only (HostSeams::gathers_into), as a GPU pool's
  // writes only its own device's: a sim destination then needs the path's landing zone.
  bool gather_host_only = false;
};

// What the zcrx double hands the next CQE instead of the truth.
enum class ZcrxFault {
  kNone,
  kUnknownArea,    // another area's token
  kOutsideArea,    // an offset past the area
  kLongerThanArea, // a length that runs past the area's end ("short" area for the CQE)
  kForeignTag,     // user_data of no request of ours
  kErrorCqe,       // res = -EFAULT (the copy fallback a dma-buf area cannot take: flow on another queue)
};
struct ZcrxCounts {
  size_t ifqs = 0;          // registered now
  size_t cqes = 0;          // posted
  size_t held = 0;          // buffers handed out, not yet refilled
  size_t refilled = 0, bad_refills = 0;
  size_t multishot_ends = 0;
};

class SimNic {
 public:
  explicit SimNic(SimNicOptions options = {});
  ~SimNic();

  // The seams for make_devmem_path: memory = host (pool and ring), gatherer = host gatherer.
  HostSeams seams();

  // Marks `queues` bound by someone else (another process) until the result is released: bind-rx
  // of them answers EEXIST, as the kernel does.
  std::shared_ptr<void> occupy_queues(std::vector<uint32_t> queues);

  // Fault injection, for the next fragment delivered (then cleared).
  void corrupt_next_id(uint32_t id);
  void corrupt_next_offset();
  void corrupt_next_token();
  void plain_next_call();
  void zcrx_fault_next(ZcrxFault f);
  void set_queue_api(bool on);  // the driver's queue API (bind-rx and zcrx: EOPNOTSUPP without)

  // Accounting.
  size_t outstanding_tokens() const;     // handed out, not yet returned
  size_t unknown_returns() const;        // returned tokens that were not outstanding
  size_t reused_before_completion() const;
  size_t fragments() const;              // fragments handed out
  size_t linear_chunks() const;
  size_t sendmsg_calls() const;
  size_t open_bindings() const;
  size_t etoosmall() const;
  ZcrxCounts zcrx_counts() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace dmx::devmem::testing
