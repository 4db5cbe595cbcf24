// The Unix-socket side channel between two processes of one host: small messages and file
// descriptors (SCM_RIGHTS), with the peer's kernel credentials. The engine connects one per agreed
// transport that needs it (TransportNeeds::side_channel) and hands it over in Bootstrap; same-host
// transports (shm, cuda_ipc) pass their regions' fds on it.
//
// Threading: a UnixChannel or UnixListener is owned by one thread at a time; neither has locks.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/sys.h"
#include "dmx/status.h"

namespace dmx {

// A connected Unix socket (SOCK_SEQPACKET) that carries small messages and file descriptors
// (SCM_RIGHTS). Every receive is strict: the message must fit, the number of fds must be exactly
// the expected one, truncated control data (MSG_CTRUNC) is an error, and any fd that arrives
// unexpectedly is closed. Every wait takes a deadline. EOF/POLLHUP reads as kPeerFailed naming
// the peer's pid.
class UnixChannel {
 public:
  static constexpr size_t kMaxMessage = 64 * 1024;
  static constexpr size_t kMaxFds = 8;

  UnixChannel() = default;
  // Both ends of a socketpair (threads, or a fork()ed child).
  static Result<std::pair<UnixChannel, UnixChannel>> pair();
  // Connect to a listener path ("@name" is the abstract namespace). Checks the listener's uid.
  static Result<UnixChannel> connect(const std::string& path, Deadline deadline);

  Status send(std::span<const std::byte> message, std::span<const int> fds, Deadline deadline);
  // Receives one message into `out` (resized) and exactly `expect_fds` fds into `fds`.
  Status recv(std::vector<std::byte>* out, size_t expect_fds, std::vector<UniqueFd>* fds, Deadline deadline);
  // Non-blocking: kPeerFailed when the peer closed its end or died, else ok.
  Status check_peer() const;

  int fd() const { return fd_.get(); }
  bool valid() const { return fd_.valid(); }
  pid_t peer_pid() const { return peer_pid_; }
  uid_t peer_uid() const { return peer_uid_; }
  // "pid 1234" (for messages and Status::with_peer).
  std::string peer_name() const;

 private:
  friend class UnixListener;
  explicit UnixChannel(UniqueFd fd);
  Status read_credentials();
  Status peer_gone(std::string_view what) const;

  UniqueFd fd_;
  pid_t peer_pid_ = -1;
  uid_t peer_uid_ = static_cast<uid_t>(-1);
};

// A listening Unix socket. accept() rejects peers with another uid.
class UnixListener {
 public:
  // "@name" binds in the abstract namespace (no file); anything else is a filesystem path that is
  // created 0600 and unlinked when the listener is destroyed. Empty: a random abstract name.
  static Result<UnixListener> listen(const std::string& path = {});
  Result<UnixChannel> accept(Deadline deadline);
  const std::string& path() const { return path_; }
  int fd() const { return fd_.get(); }

  UnixListener() = default;
  ~UnixListener();
  UnixListener(UnixListener&&) noexcept;
  UnixListener& operator=(UnixListener&&) noexcept;

 private:
  UniqueFd fd_;
  std::string path_;
};

}  // namespace dmx
