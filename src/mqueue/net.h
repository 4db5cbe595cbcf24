// mqueue/net.h — small socket helpers for the dispatcher, the baseline and the load generator.
// Every failure names the call, its address and errno.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <string>

#include "dmx/request.h"
#include "dmx/status.h"

namespace dmx::mqueue {

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset();
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

struct SockAddr {
  sockaddr_storage ss{};
  socklen_t len = 0;
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&ss); }
  std::string to_string() const;  // "127.0.0.1:5000"
};

// "host:port" (IPv4 or a name; port 0: any) to an address.
Result<SockAddr> resolve(const std::string& hostport);
Result<Fd> udp_bind(const SockAddr& addr);
Result<Fd> tcp_listen(const SockAddr& addr, int backlog = 128);
// A connected, blocking TCP socket with TCP_NODELAY; connect() waits at most `timeout`.
Result<Fd> tcp_connect(const SockAddr& addr, Duration timeout);
Result<SockAddr> local_address(int fd);
Status set_nonblocking(int fd);
// Sets SO_RCVTIMEO and SO_SNDTIMEO (blocking sockets: every wait has a deadline).
Status set_io_timeout(int fd, Duration timeout);
// Writes all of [p, p + n) on a blocking socket (kIo/kTimeout naming `what`).
Status write_all(int fd, const void* p, size_t n, const std::string& what);
// Reads exactly n bytes; kClosed on orderly EOF before the first byte, kIo/kTimeout otherwise.
Status read_all(int fd, void* p, size_t n, const std::string& what);

}  // namespace dmx::mqueue
