#include "stream/conduit.h"

#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>

#include <cerrno>

namespace dmx::stream {

Result<size_t> SocketConduit::write(std::span<const iovec> buffers) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(buffers.data());
  msg.msg_iovlen = buffers.size();
  for (;;) {
    ssize_t k = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k >= 0) {
      written_ += static_cast<size_t>(k);
      return static_cast<size_t>(k);
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    return errno_status("send", errno, Code::kPeerFailed);
  }
}

Result<size_t> SocketConduit::read(void* dst, size_t n) {
  for (;;) {
    ssize_t k = ::recv(fd_.get(), dst, n, MSG_DONTWAIT);
    if (k > 0) return static_cast<size_t>(k);
    if (k == 0) return Status(Code::kPeerFailed, "connection closed by the peer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    return errno_status("recv", errno, Code::kPeerFailed);
  }
}

Result<size_t> SocketConduit::readv(std::span<const iovec> buffers) {
  msghdr m{};
  m.msg_iov = const_cast<iovec*>(buffers.data());
  m.msg_iovlen = buffers.size();
  for (;;) {
    ssize_t k = ::recvmsg(fd_.get(), &m, MSG_DONTWAIT);
    if (k > 0) return static_cast<size_t>(k);
    if (k == 0) return Status(Code::kPeerFailed, "connection closed by the peer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    return errno_status("recvmsg", errno, Code::kPeerFailed);
  }
}

int SocketConduit::prepare_sleep(bool want_room, pollfd* fds) {
  fds[0] = {fd_.get(), static_cast<short>(POLLIN | (want_room ? POLLOUT : 0)), 0};
  return 1;
}

void SocketConduit::shutdown() { ::shutdown(fd_.get(), SHUT_RDWR); }

// What we wrote less what the socket still holds (unsent or unacknowledged: SIOCOUTQ).
uint64_t SocketConduit::acked_bytes() const {
  int queued = 0;
  if (::ioctl(fd_.get(), SIOCOUTQ, &queued) != 0 || queued < 0) return 0;
  return written_ - std::min<uint64_t>(written_, static_cast<uint64_t>(queued));
}

}  // namespace dmx::stream
