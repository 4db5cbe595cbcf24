// A test double of the Linux 6.18 devmem TCP kernel side, for tests on every machine.
//
// It reproduces what the kernel does (net/ipv4/tcp.c tcp_recvmsg_dmabuf, net/core/sock.c
// sock_devmem_dontneed, the MSG_ZEROCOPY error queue), not what we wish it did:
//  - received payload sits in 4 KiB pages of the bound "dmabuf" (host memory here), chosen from
//    the free pages at random, so fragments are scattered; a fragment is at most one page;
//  - bytes header split could not separate arrive as linear chunks: copied, packed, into the
//    recvmsg iov, with an SCM_DEVMEM_LINEAR cmsg; readable and devmem skbs never mix in a call;
//  - each delivered fragment piece gets a token (lowest free id, 31-bit), pinning its page;
//    SO_DEVMEM_DONTNEED frees tokens (<= 128 ranges, stops after 1024 frags, returns a count,
//    skips unknown tokens, EINVAL on bad lengths); a freed page is immediately reused (and
//    scribbled), so returning a token before the gather finished corrupts data, as on a NIC;
//  - a control buffer too small for the next cmsg ends the call: a short count, or ETOOSMALL
//    (525) when nothing was delivered; recvmsg without MSG_SOCK_DEVMEM on devmem data: EFAULT;
//  - TX: SCM_DEVMEM_DMABUF with a u32 id, MSG_ZEROCOPY + SO_ZEROCOPY required (EINVAL), the route
//    device must be the binding's (ENODEV), offsets past the dmabuf EFAULT; each sendmsg that
//    queues bytes takes the next notification id; the "NIC" reads the dmabuf only when it
//    completes, and completions arrive as coalesced [lo, hi] ranges on the error queue.
// Fault injection covers what a buggy kernel or hostile peer could cause (unknown dmabuf ids,
// fragments outside the buffer, token overflow, extra bytes). Single-threaded, like the code under
// test.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "transport/devmem/kernel.h"

namespace dmx::devmem::testing {

// A zerocopy completion queue as the kernel keeps it: [lo, hi] ranges of send ids.
using ZerocopyQueue = std::deque<std::pair<uint32_t, uint32_t>>;
// recvmsg(MSG_ERRQUEUE) on `queue`, as Linux answers it: -EAGAIN when empty, MSG_CTRUNC (and the
// notification kept) when the control buffer is too small, else one IP_RECVERR cmsg for the
// oldest range. Shared by the doubles.
ssize_t recv_zerocopy_notification(ZerocopyQueue& queue, msghdr* msg);

struct RxLayout {
  uint32_t mss = 4096;          // payload bytes per "packet"
  double linear_fraction = 0;   // probability a packet's payload lands in the linear area
  uint32_t max_frag = 4096;     // fragments are cut at page ends and at this size
  bool page_aligned = false;    // packets start at page offset 0 (else a random offset)
};

class KernelDouble final : public KernelSocket {
 public:
  KernelDouble(size_t pool_bytes, uint32_t rx_binding_id, uint64_t seed = 1);

  // --- RX: what the peer sent and the NIC placed ---
  uint8_t* pool() { return pool_.data(); }
  size_t pool_size() const { return pool_.size(); }
  uint32_t rx_binding_id() const { return rx_id_; }
  // Delivers `data` into the receive queue; false when the pool has no free pages left (a real
  // NIC would stop the flow).
  bool inject(const std::vector<uint8_t>& data, const RxLayout& layout);
  // Ordinary (non-devmem) TCP bytes, as from a queue without a binding.
  void inject_plain(const std::vector<uint8_t>& data);
  size_t queued_bytes() const;
  // Called from poll() when it would time out: lets a test feed data "arriving later".
  std::function<void()> on_idle;

  // Fault injection (applies to the next delivered fragment).
  uint32_t corrupt_id = 0;         // report this dmabuf id instead
  bool corrupt_offset = false;     // report an offset past the pool
  bool corrupt_token = false;      // report a token >= 2^31
  int fail_next_recv = 0;          // errno for the next recvmsg
  bool peer_closed = false;        // recvmsg returns 0 once the queue is empty

  // Accounting.
  size_t user_tokens() const { return tokens_.size(); }  // handed out, not yet returned
  size_t dontneed_calls = 0;
  size_t max_ranges_per_call = 0;
  size_t max_frags_per_call = 0;
  size_t etoosmall = 0;
  void close_socket();  // like tcp_release_user_frags(): frees every user token

  // --- TX ---
  std::vector<uint8_t>& tx_dmabuf() { return tx_mem_; }
  void set_tx_binding(uint32_t id, size_t size, std::string dev);
  std::string route_dev;        // the device the socket's route leaves through
  size_t tx_window = 1 << 20;   // bytes accepted before EAGAIN (partial sends happen at the edge)
  bool auto_complete = true;    // poll() completes everything in flight
  void complete(size_t n);      // the NIC finishes the oldest n sends (reads their bytes now)
  std::vector<uint8_t> wire;    // bytes the NIC transmitted, in order
  uint32_t next_zc_id() const { return zc_id_; }

  // KernelSocket
  ssize_t recvmsg(msghdr* msg, int flags) override;
  ssize_t sendmsg(const msghdr* msg, int flags) override;
  int setsockopt(int level, int name, const void* value, socklen_t len) override;
  int poll(short events, int timeout_ms) override;

 private:
  struct Piece {          // one fragment of an skb, or its linear head
    bool linear;
    std::vector<uint8_t> bytes;  // linear only
    uint32_t page = 0;           // frag only
    uint32_t off = 0;            // offset inside the page
    uint32_t len = 0;
    bool plain = false;          // ordinary readable skb data
  };
  uint32_t alloc_page();
  void put_page(uint32_t page);
  uint32_t alloc_token();
  ssize_t recv_errqueue(msghdr* msg);
  int dontneed(const void* value, socklen_t len);

  std::vector<uint8_t> pool_;
  uint32_t rx_id_;
  std::mt19937_64 rng_;
  std::vector<uint32_t> free_pages_;
  std::vector<uint32_t> page_refs_;
  std::deque<Piece> queue_;
  std::map<uint32_t, uint32_t> tokens_;  // token -> page
  std::set<uint32_t> free_tokens_;       // ids below next_token_ that were freed
  uint32_t next_token_ = 0;

  // TX state
  std::vector<uint8_t> tx_mem_;
  uint32_t tx_id_ = 0;
  std::string tx_dev_;
  bool zerocopy_ = false;
  std::string bound_dev_;
  struct InFlight {
    uint32_t id;
    uint64_t offset;
    uint64_t len;
  };
  std::deque<InFlight> inflight_;
  size_t inflight_bytes_ = 0;
  uint32_t zc_id_ = 0;
  ZerocopyQueue errqueue_;
};

// NetlinkOps double: binding ids, scripted errors, and whether bindings are still open.
class NetlinkDouble final : public NetlinkOps {
 public:
  NetdevSupport support{true, true, true, ""};
  Status rx_error;  // returned by bind_rx when set
  Status tx_error;
  uint32_t next_id = 7;
  std::set<uint32_t> open_bindings;
  std::vector<std::vector<uint32_t>> rx_queues_seen;

  NetdevSupport detect() override { return support; }
  Result<std::unique_ptr<Binding>> bind_rx(int ifindex, int dmabuf_fd, std::span<const uint32_t> queues) override;
  Result<std::unique_ptr<Binding>> bind_tx(int ifindex, int dmabuf_fd) override;
};

}  // namespace dmx::devmem::testing
