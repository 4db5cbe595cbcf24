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
//    (525) when nothing was delivered (EFAULT on kernels before put_cmsg_notrunc, 6.14: set
//    `legacy_cmsg`); recvmsg without MSG_SOCK_DEVMEM on devmem data: EFAULT;
//  - TX: SCM_DEVMEM_DMABUF with a u32 id, MSG_ZEROCOPY + SO_ZEROCOPY required (EINVAL), the
//    socket's ROUTE device must be the binding's (ENODEV); SO_BINDTODEVICE on a connected socket
//    resets the route (sk_dst_reset) and, before the late-2025 fix, nothing re-routes it for this
//    check, so the send fails with ENODEV; offsets past the dmabuf EFAULT; each sendmsg that
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
#include <string_view>
#include <vector>

#include "core/sys.h"
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
  bool legacy_cmsg = false;        // a kernel before 6.14: EFAULT where 6.14+ says ETOOSMALL
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
  // The device the connected socket's route leaves through (chosen at connect, by SO_BINDTODEVICE
  // made before it or by the routing table); "" once SO_BINDTODEVICE reset it after connect.
  std::string route_dev;
  size_t route_resets = 0;      // SO_BINDTODEVICE calls on the connected socket
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

// The kernel's answer to a failed bind, worded as KernelNetlinkOps reports it:
// "<what> failed: <strerror> (errno N)[; kernel: <extack>]", with its status code.
Status kernel_bind_error(std::string_view what, int err, std::string_view extack = {});

// A registry of "dma-buf" files: memfds the doubles treat as dma-bufs (dma_buf_get accepts them),
// keyed by inode so that a dup or a reused fd number is judged by the file, as the kernel does.
class DmabufFiles {
 public:
  UniqueFd make(size_t size);        // a new dma-buf stand-in of `size` bytes
  void adopt(int fd);                // treat this open file as a dma-buf
  // dma_buf_get(): 0, -EBADF (not an open fd) or -EINVAL (a file that is not a dma-buf).
  int get(int fd) const;

 private:
  std::set<std::pair<uint64_t, uint64_t>> files_;  // (st_dev, st_ino)
};

// One NIC as netdev bind-rx / bind-tx see it, checked in the kernel's order (6.18:
// netdev_nl_bind_rx_doit -> netdev_nl_read_rxq_bitmap -> net_devmem_bind_dmabuf (dma_buf_get) ->
// __net_mp_open_rxq per queue; netdev_nl_bind_tx_doit):
//   rx: ENODEV (ifindex) / EOPNOTSUPP (no queue API) / EINVAL, bad attribute (queue id out of
//       range) / EBADF, EINVAL (fd) / EINVAL "tcp-data-split is disabled", "hds-thresh is not
//       zero" / EEXIST "designated queue already memory provider bound";
//   tx: ENODEV / EOPNOTSUPP "Driver does not support netmem TX" / EBADF, EINVAL (fd).
struct BindModel {
  int ifindex = 2;
  uint32_t rx_queues = 16;
  bool queue_api = true;
  bool netmem_tx = true;
  bool hds_on = true;           // tcp-data-split enabled
  uint32_t hds_thresh = 0;
  std::set<uint32_t> bound;     // RX queues with a memory provider
  // 0 or -errno, with the extack text.
  int check_rx(int ifindex, int fd_state, std::span<const uint32_t> queues, std::string* extack) const;
  int check_tx(int ifindex, int fd_state, std::string* extack) const;
};

// NetlinkOps double: a BindModel NIC, the dma-buf registry, binding ids, scripted errors, and
// whether bindings are still open. A binding holds its queues until it is destroyed.
class NetlinkDouble final : public NetlinkOps {
 public:
  NetdevSupport support{true, true, true, ""};
  BindModel nic;
  DmabufFiles dmabufs;
  Status rx_error;  // returned by bind_rx when set (before the model is asked)
  Status tx_error;
  uint32_t next_id = 7;
  std::set<uint32_t> open_bindings;
  std::vector<std::vector<uint32_t>> rx_queues_seen;

  NetdevSupport detect() override { return support; }
  const void* kernel_id() const override { return this; }
  Result<std::unique_ptr<Binding>> bind_rx(int ifindex, int dmabuf_fd, std::span<const uint32_t> queues) override;
  Result<std::unique_ptr<Binding>> bind_tx(int ifindex, int dmabuf_fd) override;
};

}  // namespace dmx::devmem::testing
