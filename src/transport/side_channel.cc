// The Unix-socket side channel: SOCK_SEQPACKET (message boundaries kept by the kernel, so a
// message is one sendmsg and truncation is visible as MSG_TRUNC), fds by SCM_RIGHTS.
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/log.h"
#include "transport/side_channel.h"

namespace dmx {
namespace {

Status set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return errno_status("fcntl(O_NONBLOCK)", errno);
  return Status();
}

// Waits for `events` on fd; kTimeout at the deadline. POLLHUP/POLLERR are returned to the caller
// through *revents so that it can name the peer.
Status poll_one(int fd, short events, Deadline deadline, std::string_view what, short* revents) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, deadline.poll_timeout_ms());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status("poll", errno);
    }
    if (n > 0) {
      *revents = p.revents;
      return Status();
    }
    if (deadline.expired()) return Status(Code::kTimeout, fmt::format("{} did not complete by the deadline", what));
  }
}

Result<sockaddr_un> make_address(const std::string& path, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path)
    return Status(Code::kInvalidArgument, fmt::format("unix socket path '{}' is empty or too long", path));
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size());
  return addr;
}

}  // namespace

UnixChannel::UnixChannel(UniqueFd fd) : fd_(std::move(fd)) {}

std::string UnixChannel::peer_name() const { return fmt::format("pid {}", peer_pid_); }

Status UnixChannel::read_credentials() {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd_.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return errno_status("getsockopt(SO_PEERCRED)", errno);
  peer_pid_ = cred.pid;
  peer_uid_ = cred.uid;
  if (cred.uid != ::geteuid())
    return Status(Code::kAuth, fmt::format("unix peer pid {} runs as uid {}, we run as uid {}: refused", cred.pid,
                                           cred.uid, ::geteuid()));
  // SO_PEERCRED names whoever created the socket (for a socketpair handed to a fork()ed child, the
  // parent). With SO_PASSCRED the kernel attaches the real sender's credentials to every message,
  // and recv() updates the peer from them.
  int one = 1;
  if (::setsockopt(fd_.get(), SOL_SOCKET, SO_PASSCRED, &one, sizeof one) != 0)
    return errno_status("setsockopt(SO_PASSCRED)", errno);
  return set_nonblocking(fd_.get());
}

Status UnixChannel::peer_gone(std::string_view what) const {
  return Status(Code::kPeerFailed,
                fmt::format("{}: peer {} closed the side channel (process exited or was killed)", what, peer_name()))
      .with_peer(peer_name());
}

Result<std::pair<UnixChannel, UnixChannel>> UnixChannel::pair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    return errno_status("socketpair(AF_UNIX, SOCK_SEQPACKET)", errno);
  UnixChannel a{UniqueFd(sv[0])}, b{UniqueFd(sv[1])};
  DMX_RETURN_IF_ERROR(a.read_credentials());
  DMX_RETURN_IF_ERROR(b.read_credentials());
  return std::make_pair(std::move(a), std::move(b));
}

Result<UnixChannel> UnixChannel::connect(const std::string& path, Deadline deadline) {
  socklen_t len = 0;
  DMX_ASSIGN_OR_RETURN(sockaddr_un addr, make_address(path, &len));
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return errno_status("socket(AF_UNIX)", errno);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    if (errno != EINPROGRESS && errno != EAGAIN)
      return errno_status(fmt::format("connect({})", path), errno, Code::kUnavailable);
    short revents = 0;
    DMX_RETURN_IF_ERROR(poll_one(fd.get(), POLLOUT, deadline, fmt::format("connect({})", path), &revents));
    int err = 0;
    socklen_t elen = sizeof err;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &elen);
    if (err != 0) return errno_status(fmt::format("connect({})", path), err, Code::kUnavailable);
  }
  UnixChannel ch(std::move(fd));
  DMX_RETURN_IF_ERROR(ch.read_credentials());
  return ch;
}

Status UnixChannel::send(std::span<const std::byte> message, std::span<const int> fds, Deadline deadline) {
  if (message.empty() || message.size() > kMaxMessage || fds.size() > kMaxFds)
    return Status(Code::kInvalidArgument,
                  fmt::format("side channel message of {} B with {} fds (1-{} B, at most {} fds)", message.size(),
                              fds.size(), kMaxMessage, kMaxFds));
  iovec iov{const_cast<std::byte*>(message.data()), message.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL);
    if (n >= 0) return Status();  // SEQPACKET: all or nothing
    if (errno == EINTR) continue;
    if (errno == EPIPE || errno == ECONNRESET) return peer_gone("send");
    if (errno != EAGAIN) return errno_status(fmt::format("sendmsg(unix, peer {})", peer_name()), errno);
    short revents = 0;
    DMX_RETURN_IF_ERROR(poll_one(fd_.get(), POLLOUT, deadline, "side channel send", &revents));
    if ((revents & (POLLHUP | POLLERR)) && !(revents & POLLOUT)) return peer_gone("send");
  }
}

Status UnixChannel::recv(std::vector<std::byte>* out, size_t expect_fds, std::vector<UniqueFd>* fds,
                         Deadline deadline) {
  assert(expect_fds <= kMaxFds);
  out->resize(kMaxMessage);
  // Room for more fds than allowed, so that a peer sending too many is seen (and they are closed)
  // rather than silently cut off.
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * (kMaxFds + 4)) + CMSG_SPACE(sizeof(ucred))];
  for (;;) {
    iovec iov{out->data(), out->size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n = ::recvmsg(fd_.get(), &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == ECONNRESET) return peer_gone("recv");
      if (errno != EAGAIN) return errno_status(fmt::format("recvmsg(unix, peer {})", peer_name()), errno);
      short revents = 0;
      DMX_RETURN_IF_ERROR(poll_one(fd_.get(), POLLIN, deadline, "side channel recv", &revents));
      if ((revents & (POLLHUP | POLLERR)) && !(revents & POLLIN)) return peer_gone("recv");
      continue;
    }
    if (n == 0) return peer_gone("recv");
    // Take ownership of every fd that arrived before judging the message, so none leaks.
    std::vector<UniqueFd> got;
    bool have_cred = false;
    ucred cred{};
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len >= CMSG_LEN(sizeof cred)) {
        std::memcpy(&cred, CMSG_DATA(c), sizeof cred);
        have_cred = true;
        continue;
      }
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        got.emplace_back(fd);
      }
    }
    if (have_cred) {
      if (cred.uid != ::geteuid())
        return Status(Code::kAuth, fmt::format("side channel: message from pid {} with uid {}: refused", cred.pid,
                                               cred.uid));
      peer_pid_ = cred.pid;
    }
    if (msg.msg_flags & MSG_TRUNC)
      return Status(Code::kProtocol, fmt::format("side channel: peer {} sent a message over {} B", peer_name(),
                                                 kMaxMessage));
    if (msg.msg_flags & MSG_CTRUNC)
      return Status(Code::kProtocol,
                    fmt::format("side channel: control data from peer {} was truncated (too many fds)", peer_name()));
    if (got.size() != expect_fds)
      return Status(Code::kProtocol, fmt::format("side channel: peer {} sent {} fds, expected {} (closed them)",
                                                 peer_name(), got.size(), expect_fds));
    out->resize(static_cast<size_t>(n));
    if (fds != nullptr) *fds = std::move(got);
    return Status();
  }
}

Status UnixChannel::check_peer() const {
  pollfd p{fd_.get(), POLLRDHUP, 0};
  int n = ::poll(&p, 1, 0);
  if (n > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR))) return peer_gone("check");
  return Status();
}

// ---- listener ----

Result<UnixListener> UnixListener::listen(const std::string& path_in) {
  std::string path = path_in;
  if (path.empty()) path = fmt::format("@dmx-{}-{:016x}", ::getpid(), random_u64());
  socklen_t len = 0;
  DMX_ASSIGN_OR_RETURN(sockaddr_un addr, make_address(path, &len));
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return errno_status("socket(AF_UNIX)", errno);
  if (path[0] != '@') ::unlink(path.c_str());
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0)
    return errno_status(fmt::format("bind({})", path), errno);
  // A filesystem socket is made 0600 so that only our uid can even connect (accept() checks the
  // uid anyway, which also covers the abstract namespace and the moment before the chmod).
  if (path[0] != '@' && ::chmod(path.c_str(), 0600) != 0) return errno_status(fmt::format("chmod({})", path), errno);
  if (::listen(fd.get(), 16) != 0) return errno_status(fmt::format("listen({})", path), errno);
  UnixListener l;
  l.fd_ = std::move(fd);
  l.path_ = path;
  return l;
}

Result<UnixChannel> UnixListener::accept(Deadline deadline) {
  for (;;) {
    int c = ::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c >= 0) {
      UnixChannel ch{UniqueFd(c)};
      Status s = ch.read_credentials();
      if (!s.ok()) {
        DMX_LOG_WARN("unix listener {}: {}", path_, s.to_string());
        return s;
      }
      return ch;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EAGAIN) return errno_status(fmt::format("accept({})", path_), errno);
    short revents = 0;
    DMX_RETURN_IF_ERROR(poll_one(fd_.get(), POLLIN, deadline, fmt::format("accept({})", path_), &revents));
  }
}

UnixListener::~UnixListener() {
  if (fd_.valid() && !path_.empty() && path_[0] != '@') ::unlink(path_.c_str());
}
UnixListener::UnixListener(UnixListener&& o) noexcept : fd_(std::move(o.fd_)), path_(std::move(o.path_)) {
  o.path_.clear();
}
UnixListener& UnixListener::operator=(UnixListener&& o) noexcept {
  if (this != &o) {
    if (fd_.valid() && !path_.empty() && path_[0] != '@') ::unlink(path_.c_str());
    fd_ = std::move(o.fd_);
    path_ = std::move(o.path_);
    o.path_.clear();
  }
  return *this;
}

}  // namespace dmx
