#include "mqueue/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dmx::mqueue {
namespace {

Status io_error(const std::string& call, int err) {
  return Status(err == EAGAIN || err == EWOULDBLOCK ? Code::kTimeout : Code::kIo,
                call + " failed: " + std::strerror(err));
}

}  // namespace

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string SockAddr::to_string() const {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

Result<SockAddr> resolve(const std::string& hostport) {
  size_t colon = hostport.rfind(':');
  if (colon == std::string::npos || colon + 1 == hostport.size())
    return Status(Code::kInvalidArgument, "address '" + hostport + "': expected host:port");
  std::string host = hostport.substr(0, colon), port = hostport.substr(colon + 1);
  if (host.empty()) host = "0.0.0.0";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr)
    return Status(Code::kInvalidArgument, "address '" + hostport + "': " + ::gai_strerror(rc));
  SockAddr a;
  std::memcpy(&a.ss, res->ai_addr, res->ai_addrlen);
  a.len = res->ai_addrlen;
  ::freeaddrinfo(res);
  return a;
}

Status set_nonblocking(int fd) {
  int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return io_error("fcntl(O_NONBLOCK)", errno);
  return Status();
}

Result<Fd> udp_bind(const SockAddr& addr) {
  Fd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return io_error("socket(udp)", errno);
  int buf = 4 << 20;  // room for bursts; the kernel caps it at rmem_max
  (void)::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  (void)::setsockopt(fd.get(), SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  if (::bind(fd.get(), addr.sa(), addr.len) < 0) return io_error("bind(udp " + addr.to_string() + ")", errno);
  return fd;
}

Result<Fd> tcp_listen(const SockAddr& addr, int backlog) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return io_error("socket(tcp)", errno);
  int one = 1;
  (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), addr.sa(), addr.len) < 0) return io_error("bind(tcp " + addr.to_string() + ")", errno);
  if (::listen(fd.get(), backlog) < 0) return io_error("listen(" + addr.to_string() + ")", errno);
  return fd;
}

Result<Fd> tcp_connect(const SockAddr& addr, Duration timeout) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return io_error("socket(tcp)", errno);
  DMX_RETURN_IF_ERROR(set_nonblocking(fd.get()));
  const std::string what = "connect(" + addr.to_string() + ")";
  if (::connect(fd.get(), addr.sa(), addr.len) < 0) {
    if (errno != EINPROGRESS) return io_error(what, errno);
    pollfd p{fd.get(), POLLOUT, 0};
    int ms = timeout == kForever ? -1 : static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count());
    int rc = ::poll(&p, 1, ms);
    if (rc == 0) return Status(Code::kTimeout, what + " did not complete in time");
    int err = 0;
    socklen_t len = sizeof err;
    if (rc < 0 || ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) < 0) return io_error(what, errno);
    if (err != 0) return io_error(what, err);
  }
  int fl = ::fcntl(fd.get(), F_GETFL);
  (void)::fcntl(fd.get(), F_SETFL, fl & ~O_NONBLOCK);
  int one = 1;
  (void)::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

Result<SockAddr> local_address(int fd) {
  SockAddr a;
  a.len = sizeof a.ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a.ss), &a.len) < 0) return io_error("getsockname", errno);
  return a;
}

Status set_io_timeout(int fd, Duration timeout) {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(timeout).count();
  timeval tv{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0)
    return io_error("setsockopt(SO_RCVTIMEO)", errno);
  return Status();
}

Status write_all(int fd, const void* p, size_t n, const std::string& what) {
  auto* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return io_error("send(" + what + ")", errno);
    c += k;
    n -= static_cast<size_t>(k);
  }
  return Status();
}

Status read_all(int fd, void* p, size_t n, const std::string& what) {
  auto* c = static_cast<char*>(p);
  size_t got = 0;
  while (got < n) {
    ssize_t k = ::recv(fd, c + got, n - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return io_error("recv(" + what + ")", errno);
    if (k == 0)
      return Status(got == 0 ? Code::kClosed : Code::kIo,
                    what + " closed the connection" + (got ? " mid-message" : ""));
    got += static_cast<size_t>(k);
  }
  return Status();
}

}  // namespace dmx::mqueue
