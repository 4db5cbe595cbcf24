// devmem TCP transmit: sendmsg(MSG_ZEROCOPY) straight from a bound TX dmabuf.
//
// Each sendmsg carries one SCM_DEVMEM_DMABUF control message (the 32-bit binding id) and an iov
// whose base is an *offset into the dmabuf*, not a pointer. Every sendmsg that queued bytes
// consumes one zerocopy notification id (0, 1, 2, ... per socket, wrapping at 2^32); the kernel
// reports finished ids as ranges [lo, hi] on the socket's error queue. A send's region is in use
// until all of its ids have been reported; only then may the caller write into it again.
//
// Send lifecycle (per ticket):  queued (bytes handed to the kernel, ids pending) -> completed.
// Errors are sticky: after one, every wait fails with it (the endpoint is closed; make a new one).
// A wait that merely times out is not an error of the connection and is not sticky.
// Thread-safety: one owner thread. The socket and binding must outlive the DevmemTx.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>

#include "core/clock.h"
#include "dmx/status.h"
#include "transport/devmem/kernel.h"

namespace dmx::devmem {

struct TxBindingInfo {
  uint32_t dmabuf_id = 0;    // from bind-tx
  uint64_t dmabuf_size = 0;  // bytes in the dmabuf
};

struct TxOptions {
  std::string ifname;        // the bound NIC, named in errors (the route must leave through it)
  size_t max_send = 4 << 20; // bytes per sendmsg (smaller sends complete, and free, sooner)
  std::string peer;          // named in errors
};

struct TxStats {
  uint64_t sends = 0;          // tickets
  uint64_t sendmsg_calls = 0;  // sendmsg calls that queued bytes
  uint64_t bytes = 0;
  uint64_t notifications = 0;  // error-queue messages read
  uint64_t copied = 0;         // ids the kernel reported as copied (SO_EE_CODE_ZEROCOPY_COPIED)
  uint64_t spurious = 0;       // ids reported that we never sent
  uint64_t enobufs = 0;
};

class DevmemTx {
 public:
  // Sets SO_ZEROCOPY. Never SO_BINDTODEVICE: that must come before connect (it resets the route of
  // a connected socket, and the kernel checks the route's device against the binding's).
  static Result<std::unique_ptr<DevmemTx>> create(KernelSocket* sock, TxBindingInfo binding, TxOptions options);

  // Hands [offset, offset+len) of the dmabuf to the kernel (blocking until all bytes are queued,
  // or the deadline) and returns a ticket that completes when the NIC is done with the region.
  Result<uint64_t> send(uint64_t offset, uint64_t len, Deadline deadline);
  // The same in steps, for a progress loop that also does other things (the engine's devmem path):
  // start_send registers the send and returns its ticket; push_send queues what the socket takes
  // now without blocking and returns true once every byte is queued (poll for POLLOUT otherwise).
  // A ticket completes only after all its bytes were queued and all their ids reported.
  Result<uint64_t> start_send(uint64_t offset, uint64_t len);
  // The same from another TX binding on this socket (a registered region bound for TX of its own;
  // the zerocopy ids are the socket's, shared by every binding).
  Result<uint64_t> start_send(uint64_t offset, uint64_t len, TxBindingInfo binding);
  Result<bool> push_send(uint64_t ticket);
  // Reads the error queue without blocking and completes what it reports.
  Status poll_completions();
  bool completed(uint64_t ticket) const;
  Status wait(uint64_t ticket, Deadline deadline);
  // Waits until no unfinished send overlaps [offset, offset+len).
  Status wait_region_free(uint64_t offset, uint64_t len, Deadline deadline);

  size_t inflight_sends() const { return tickets_.size(); }
  const TxStats& stats() const { return stats_; }

 private:
  struct Ticket {
    uint64_t offset = 0;
    uint64_t len = 0;
    uint64_t sent = 0;        // bytes queued so far
    uint32_t pending_ids = 0;
    uint32_t dmabuf_id = 0;
  };
  DevmemTx(KernelSocket* sock, TxBindingInfo binding, TxOptions options)
      : sock_(sock), binding_(binding), opt_(std::move(options)) {}
  Status fail(Status s);
  void complete_id(uint32_t id);
  Status wait_until(const std::function<bool()>& done, Deadline deadline, const char* what);

  KernelSocket* sock_;
  TxBindingInfo binding_;
  TxOptions opt_;
  uint32_t next_id_ = 0;
  uint64_t next_ticket_ = 1;
  std::map<uint64_t, Ticket> tickets_;              // unfinished sends
  std::unordered_map<uint32_t, uint64_t> id_ticket_; // notification id -> ticket
  TxStats stats_;
  Status failed_;
};

}  // namespace dmx::devmem
