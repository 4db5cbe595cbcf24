#include "transport/devmem/tx.h"

#include <fmt/format.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <poll.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "core/log.h"
#include "core/sys.h"
#include "transport/devmem/kernel_abi.h"

namespace dmx::devmem {

Result<std::unique_ptr<DevmemTx>> DevmemTx::create(KernelSocket* sock, TxBindingInfo binding, TxOptions options) {
  if (options.max_send == 0) return Status(Code::kInvalidArgument, "devmem tx: max_send must be > 0");
  int one = 1;
  if (int r = sock->setsockopt(SOL_SOCKET, abi::kSoZerocopy, &one, sizeof one); r < 0)
    return errno_status("setsockopt(SO_ZEROCOPY)", -r, Code::kUnavailable);
  // No SO_BINDTODEVICE here: on a connected socket it resets the route, and kernels before the
  // late-2025 fix then fail every devmem send with ENODEV. The socket is bound before connect
  // (the engine's data socket: Transport::data_socket_device) or routed through the NIC.
  return std::unique_ptr<DevmemTx>(new DevmemTx(sock, binding, std::move(options)));
}

Status DevmemTx::fail(Status s) {
  if (!opt_.peer.empty()) s = s.with_peer(opt_.peer);
  s = s.with_origin("devmem/tx");
  DMX_LOG_ERROR("devmem tx: {}", s.to_string());
  failed_ = s;
  return s;
}

void DevmemTx::complete_id(uint32_t id) {
  auto it = id_ticket_.find(id);
  if (it == id_ticket_.end()) {
    ++stats_.spurious;
    return;
  }
  auto t = tickets_.find(it->second);
  id_ticket_.erase(it);
  // A ticket whose bytes are not all queued yet stays (its later sendmsg calls take more ids).
  if (t != tickets_.end() && --t->second.pending_ids == 0 && t->second.sent == t->second.len) tickets_.erase(t);
}

Status DevmemTx::poll_completions() {
  if (!failed_.ok()) return failed_;
  alignas(cmsghdr) uint8_t control[256];
  for (;;) {
    msghdr msg{};
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n = sock_->recvmsg(&msg, MSG_ERRQUEUE | MSG_DONTWAIT);
    if (n == -EAGAIN || n == -EWOULDBLOCK) return Status();
    if (n < 0) return fail(errno_status("recvmsg(MSG_ERRQUEUE)", static_cast<int>(-n)));
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      bool recverr = (c->cmsg_level == SOL_IP && c->cmsg_type == IP_RECVERR) ||
                     (c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_RECVERR);
      if (!recverr || c->cmsg_len < CMSG_LEN(sizeof(sock_extended_err))) continue;
      sock_extended_err ee;
      std::memcpy(&ee, CMSG_DATA(c), sizeof ee);
      if (ee.ee_origin != SO_EE_ORIGIN_ZEROCOPY) continue;
      if (ee.ee_errno != 0) return fail(errno_status("devmem zerocopy completion", static_cast<int>(ee.ee_errno)));
      ++stats_.notifications;
      uint32_t lo = ee.ee_info, hi = ee.ee_data;
      uint64_t count = static_cast<uint32_t>(hi - lo) + uint64_t{1};
      if (ee.ee_code & SO_EE_CODE_ZEROCOPY_COPIED) stats_.copied += count;
      if (count > id_ticket_.size()) {
        // A range wider than what is in flight: walk what is in flight instead of the range.
        std::vector<uint32_t> ids;
        for (const auto& [id, t] : id_ticket_)
          if (static_cast<uint32_t>(id - lo) <= static_cast<uint32_t>(hi - lo)) ids.push_back(id);
        stats_.spurious += count - ids.size();
        for (uint32_t id : ids) complete_id(id);
      } else {
        for (uint64_t i = 0; i < count; ++i) complete_id(lo + static_cast<uint32_t>(i));
      }
    }
  }
}

Status DevmemTx::wait_until(const std::function<bool()>& done, Deadline deadline, const char* what) {
  for (;;) {
    DMX_RETURN_IF_ERROR(poll_completions());
    if (done()) return Status();
    if (deadline.expired())  // not sticky: the sends are still in flight and may complete later
      return Status(Code::kTimeout, fmt::format("devmem tx: {} not complete by the deadline", what));
    int ms = deadline.poll_timeout_ms();
    int r = sock_->poll(POLLERR, ms < 0 || ms > 1000 ? 1000 : ms);
    if (r < 0) return fail(errno_status("poll(devmem socket, POLLERR)", -r));
  }
}

Result<uint64_t> DevmemTx::start_send(uint64_t offset, uint64_t len) { return start_send(offset, len, binding_); }

Result<uint64_t> DevmemTx::start_send(uint64_t offset, uint64_t len, TxBindingInfo binding) {
  if (!failed_.ok()) return failed_;
  if (offset > binding.dmabuf_size || len > binding.dmabuf_size - offset)
    return Status(Code::kOutOfRange, fmt::format("devmem send [{}, +{}) outside the {}-byte dmabuf", offset, len,
                                                 binding.dmabuf_size));
  uint64_t ticket = next_ticket_++;
  ++stats_.sends;
  if (len == 0) return ticket;  // nothing in flight: complete at once
  tickets_[ticket] = Ticket{offset, len, 0, 0, binding.dmabuf_id};
  return ticket;
}

Result<bool> DevmemTx::push_send(uint64_t ticket) {
  if (!failed_.ok()) return failed_;
  auto it = tickets_.find(ticket);
  if (it == tickets_.end()) return true;  // empty, or already complete
  alignas(cmsghdr) uint8_t control[CMSG_SPACE(sizeof(uint32_t))];
  while (it->second.sent < it->second.len) {
    DMX_RETURN_IF_ERROR(poll_completions());
    Ticket& t = tickets_.at(ticket);  // still there: its bytes are not all queued
    std::memset(control, 0, sizeof control);
    iovec iov{reinterpret_cast<void*>(static_cast<uintptr_t>(t.offset + t.sent)),
              static_cast<size_t>(std::min<uint64_t>(t.len - t.sent, opt_.max_send))};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = abi::kScmDevmemDmabuf;
    c->cmsg_len = CMSG_LEN(sizeof(uint32_t));
    std::memcpy(CMSG_DATA(c), &t.dmabuf_id, sizeof(uint32_t));
    ssize_t n = sock_->sendmsg(&msg, abi::kMsgZerocopy | MSG_DONTWAIT);
    if (n > 0) {
      id_ticket_[next_id_++] = ticket;
      ++t.pending_ids;
      ++stats_.sendmsg_calls;
      stats_.bytes += static_cast<uint64_t>(n);
      t.sent += static_cast<uint64_t>(n);
      continue;
    }
    if (n == -EAGAIN || n == -EWOULDBLOCK || n == -ENOBUFS) {
      // ENOBUFS: too many unread notifications (optmem); reading the error queue frees them.
      if (n == -ENOBUFS) ++stats_.enobufs;
      return false;
    }
    int err = n == 0 ? EPIPE : static_cast<int>(-n);
    std::string why;
    if (err == EINVAL) why = " (binding id unknown or an RX binding, or SO_ZEROCOPY off)";
    if (err == ENODEV)
      why = fmt::format(" (the socket's route does not leave through {}, the bound NIC: bind the socket to it with "
                        "SO_BINDTODEVICE before connect, or route the peer through it)",
                        opt_.ifname.empty() ? std::string("the NIC") : opt_.ifname);
    if (err == EFAULT) why = " (offset beyond the dmabuf)";
    return fail(errno_status(fmt::format("sendmsg(MSG_ZEROCOPY, dmabuf id {}, offset {}, {} bytes){}",
                                         t.dmabuf_id, t.offset + t.sent, iov.iov_len, why),
                             err));
  }
  if (it->second.pending_ids == 0) tickets_.erase(it);  // every id already reported
  return true;
}

Result<uint64_t> DevmemTx::send(uint64_t offset, uint64_t len, Deadline deadline) {
  DMX_ASSIGN_OR_RETURN(uint64_t ticket, start_send(offset, len));
  for (;;) {
    DMX_ASSIGN_OR_RETURN(bool queued, push_send(ticket));
    if (queued) return ticket;
    if (deadline.expired()) {
      auto it = tickets_.find(ticket);
      uint64_t sent = it == tickets_.end() ? len : it->second.sent;
      return fail(Status(Code::kTimeout, fmt::format("devmem send: {} of {} bytes queued by the deadline", sent, len)));
    }
    int ms = deadline.poll_timeout_ms();
    int r = sock_->poll(POLLOUT | POLLERR, ms < 0 || ms > 1000 ? 1000 : ms);
    if (r < 0) return fail(errno_status("poll(devmem socket)", -r));
  }
}

bool DevmemTx::completed(uint64_t ticket) const { return ticket < next_ticket_ && !tickets_.contains(ticket); }

Status DevmemTx::wait(uint64_t ticket, Deadline deadline) {
  if (!failed_.ok()) return failed_;
  return wait_until([&] { return completed(ticket); }, deadline, "send");
}

Status DevmemTx::wait_region_free(uint64_t offset, uint64_t len, Deadline deadline) {
  if (!failed_.ok()) return failed_;
  auto free_now = [&] {
    for (const auto& [id, t] : tickets_)
      if (t.dmabuf_id == binding_.dmabuf_id && t.offset < offset + len && offset < t.offset + t.len) return false;
    return true;
  };
  return wait_until(free_now, deadline, "region reuse");
}

}  // namespace dmx::devmem
