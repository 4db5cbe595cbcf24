// mqueue/admission.h — what the Lynx dispatcher and the host-centric baseline share to stay up
// under hostile or merely numerous TCP clients (docs/reliability.md, "Lynx servers"):
//   - EventLimiter: at most kLinesPerKind lines of each kind per interval; the next line that
//     passes says how many were held back (a flood of clients cannot flood the log);
//   - PeerCounts: connections per peer address (the per-address cap, below the global one);
//   - kAcceptPause: how long the listen socket rests when the process is out of fds.
// Thread-safety: EventLimiter is thread-safe; PeerCounts is owned by one thread.
#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "mqueue/layout.h"
#include "mqueue/net.h"

namespace dmx::mqueue {

// Out of fds (EMFILE/ENFILE) or kernel memory, accept fails at once and the listen socket stays
// readable: rest it this long instead of spinning on it (as the engine's listener does).
inline constexpr auto kAcceptPause = std::chrono::milliseconds(100);

// True for the accept errors that mean "this process or host is out of something", not "that
// connection went bad": the ones to back off on.
bool accept_should_pause(int err);

class EventLimiter {
 public:
  static constexpr int kLinesPerKind = 10;  // per interval: a handful of distinct bad clients all show
  explicit EventLimiter(std::function<void(const std::string&)> sink,
                        std::chrono::milliseconds interval = std::chrono::seconds(1))
      : sink_(std::move(sink)), interval_(interval) {}
  // Emits `text` unless kLinesPerKind lines of `kind` (a short literal) went out this interval.
  void emit(const char* kind, const std::string& text);

 private:
  struct Slot {
    const char* kind;
    std::chrono::steady_clock::time_point start;
    int lines = 0;
    uint64_t held = 0;
  };
  std::function<void(const std::string&)> sink_;
  const std::chrono::milliseconds interval_;
  std::mutex mu_;  // guards slots_ (a few kinds, one per call site)
  std::vector<Slot> slots_;
};

// Open connections per peer host (the address without the port).
class PeerCounts {
 public:
  size_t count(const std::string& host) const {
    auto it = n_.find(host);
    return it == n_.end() ? 0 : it->second;
  }
  void add(const std::string& host) { ++n_[host]; }
  void remove(const std::string& host) {
    auto it = n_.find(host);
    if (it != n_.end() && --it->second == 0) n_.erase(it);
  }

 private:
  std::unordered_map<std::string, size_t> n_;
};

// Tells a TCP client it is refused and why: an error frame (kErrorMagic, the text) sent without
// waiting (it fits in a fresh socket's send buffer). The caller closes fd.
void send_refusal(int fd, const std::string& why);

// Refuses an accepted TCP client: the error frame, close(fd), and a "refused tcp client" line.
// The caller counts it.
void refuse_client(int fd, const SockAddr& peer, const std::string& why, EventLimiter& log);

// What a listen socket's owner does after accept(2) fails, and the lines it says: out of fds or
// memory, one line per episode and a rest of kAcceptPause; "works again" once after such an
// episode. Owned by the accepting thread.
class AcceptErrors {
 public:
  enum class Next {
    kRetry,  // that one connection went bad (EINTR, ECONNABORTED, EPROTO): accept the next
    kEmpty,  // nothing to accept (EAGAIN)
    kPause,  // out of something: rest the listen socket for kAcceptPause
    kFailed  // another error, said
  };
  AcceptErrors(std::string listen_name, EventLimiter* log) : name_(std::move(listen_name)), log_(log) {}
  Next failed(int err);
  void accepted();  // after a successful accept

 private:
  std::string name_;  // "tcp 127.0.0.1:5000"
  EventLimiter* log_;
  bool out_of_fds_ = false;  // since the last successful accept
};

// "127.0.0.1" of a peer (SockAddr::to_string without the port).
std::string host_of(const SockAddr& peer);

}  // namespace dmx::mqueue
