#include "stream/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/units.h"
#include "stream/cancel.h"

namespace dmx::stream {

std::string Address::to_string() const {
  if (host.find(':') != std::string::npos) return fmt::format("tcp://[{}]:{}", host, port);
  return fmt::format("tcp://{}:{}", host, port);
}

Result<Address> parse_address(const std::string& url) {
  std::string_view s = url;
  if (s.rfind("tcp://", 0) == 0) s.remove_prefix(6);
  else if (s.find("://") != std::string_view::npos)
    return Status(Code::kInvalidArgument, fmt::format("'{}': only tcp:// addresses are supported", url));
  Address a;
  std::string_view port;
  if (!s.empty() && s.front() == '[') {
    size_t close = s.find(']');
    if (close == std::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':')
      return Status(Code::kInvalidArgument, fmt::format("'{}': expected [ipv6]:port", url));
    a.host = std::string(s.substr(1, close - 1));
    port = s.substr(close + 2);
  } else {
    size_t colon = s.rfind(':');
    if (colon == std::string_view::npos)
      return Status(Code::kInvalidArgument, fmt::format("'{}': expected host:port", url));
    a.host = std::string(s.substr(0, colon));
    port = s.substr(colon + 1);
  }
  auto p = parse_int(port);
  if (!p.ok() || *p < 0 || *p > 65535)
    return Status(Code::kInvalidArgument, fmt::format("'{}': port must be 0-65535", url));
  if (a.host.empty()) a.host = "0.0.0.0";
  a.port = static_cast<uint16_t>(*p);
  return a;
}

namespace {

Result<addrinfo*> resolve(const Address& a, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  std::string port = std::to_string(a.port);
  int rc = ::getaddrinfo(a.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0)
    return Status(Code::kInvalidArgument, fmt::format("cannot resolve '{}': {}", a.host, ::gai_strerror(rc)));
  return res;
}

std::string sockaddr_name(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
    return fmt::format("{}:{}", host, port);
  }
  if (ss.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    port = ntohs(in6->sin6_port);
    return fmt::format("[{}]:{}", host, port);
  }
  return "?";
}

Status set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return errno_status("fcntl(O_NONBLOCK)", errno);
  return Status();
}

thread_local int t_cancel_fd = -1;  // CancelWaits (cancel.h): -1, or readable when the waits should end

// Waits for `events` on fd until the deadline, or until this thread's waits are cancelled.
Status wait_fd(int fd, short events, Deadline deadline, std::string_view what, const std::string& peer) {
  for (;;) {
    pollfd p[2] = {{fd, events, 0}, {t_cancel_fd, POLLIN, 0}};  // poll skips a negative fd
    int rc = ::poll(p, 2, deadline.poll_timeout_ms());
    if (rc > 0 && p[1].revents != 0)
      return Status(Code::kCancelled, fmt::format("{} was cancelled: its owner ended", what)).with_peer(peer);
    if (rc > 0) return Status();
    if (rc == 0 || deadline.expired())
      return Status(Code::kTimeout, fmt::format("{} did not finish before the deadline", what)).with_peer(peer);
    if (errno != EINTR) return errno_status("poll", errno).with_peer(peer);
  }
}

}  // namespace

CancelWaits::CancelWaits(int fd) : previous_(std::exchange(t_cancel_fd, fd)) {}
CancelWaits::~CancelWaits() { t_cancel_fd = previous_; }

Result<UniqueFd> listen_on(const Address& addr, int backlog) {
  DMX_ASSIGN_OR_RETURN(addrinfo * res, resolve(addr, true));
  Status last(Code::kIo, "no address to listen on");
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
      last = errno_status("socket", errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last = errno_status(fmt::format("bind({})", addr.to_string()), errno);
      continue;
    }
    if (::listen(fd.get(), backlog) != 0) {
      last = errno_status(fmt::format("listen({})", addr.to_string()), errno);
      continue;
    }
    Status nb = set_nonblocking(fd.get());
    if (!nb.ok()) {
      last = nb;
      continue;
    }
    ::freeaddrinfo(res);
    return fd;
  }
  ::freeaddrinfo(res);
  return last;
}

std::string local_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return sockaddr_name(ss);
}

std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return sockaddr_name(ss);
}

Result<UniqueFd> connect_to(const Address& addr, Deadline deadline, const std::string& bind_device, bool* refused) {
  DMX_ASSIGN_OR_RETURN(addrinfo * res, resolve(addr, false));
  std::string name = addr.to_string();
  Status last(Code::kIo, "no address to connect to");
  bool last_refused = false;
  // The kernel knows at once that nobody listens: say so plainly (the caller decides on retrying).
  auto failed = [&](int err) {
    last_refused = err == ECONNREFUSED;
    if (!last_refused) return errno_status(fmt::format("connect({})", name), err);
    return Status(Code::kIo, fmt::format("connection refused by {}: nobody listens there", name));
  };
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) {
      last = errno_status("socket", errno);
      continue;
    }
    if (!bind_device.empty() && ::setsockopt(fd.get(), SOL_SOCKET, SO_BINDTODEVICE, bind_device.c_str(),
                                             static_cast<socklen_t>(bind_device.size())) != 0) {
      last = errno_status(fmt::format("setsockopt(SO_BINDTODEVICE, {}) before connect({})", bind_device, name), errno,
                          errno == EPERM ? Code::kUnavailable : Code::kIo);
      continue;
    }
    if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last = failed(errno);
        continue;
      }
      Status w = wait_fd(fd.get(), POLLOUT, deadline, fmt::format("connect({})", name), name);
      if (!w.ok()) {
        last = w;
        last_refused = false;
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last = failed(err);
        continue;
      }
    }
    ::freeaddrinfo(res);
    return fd;
  }
  ::freeaddrinfo(res);
  if (refused != nullptr) *refused = last_refused;
  return last;
}

unsigned user_timeout_ms(std::chrono::microseconds peer_timeout) {
  return static_cast<unsigned>(std::clamp<int64_t>(2 * (peer_timeout.count() / 1000), 0, UINT32_MAX));
}

Status configure_stream(int fd, const StreamOptions& o) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) return errno_status("setsockopt(TCP_NODELAY)", errno);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  if (o.user_timeout_ms > 0) ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &o.user_timeout_ms, sizeof o.user_timeout_ms);
  if (o.socket_buffer > 0) {
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &o.socket_buffer, sizeof o.socket_buffer);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &o.socket_buffer, sizeof o.socket_buffer);
  }
  return set_nonblocking(fd);
}

Status send_exact(int fd, const void* data, size_t n, Deadline deadline, const std::string& peer) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      DMX_RETURN_IF_ERROR(wait_fd(fd, POLLOUT, deadline, "handshake send", peer));
      continue;
    }
    return errno_status("send", errno).with_peer(peer);
  }
  return Status();
}

Status recv_exact(int fd, void* data, size_t n, Deadline deadline, const std::string& peer) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t k = ::recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k == 0) return Status(Code::kPeerFailed, "connection closed by the peer during the handshake").with_peer(peer);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      DMX_RETURN_IF_ERROR(wait_fd(fd, POLLIN, deadline, "handshake receive", peer));
      continue;
    }
    return errno_status("recv", errno).with_peer(peer);
  }
  return Status();
}

}  // namespace dmx::stream
