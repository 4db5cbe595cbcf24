#include "mqueue/admission.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

namespace dmx::mqueue {

bool accept_should_pause(int err) {
  return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

void EventLimiter::emit(const char* kind, const std::string& text) {
  std::string line;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto now = std::chrono::steady_clock::now();
    Slot* s = nullptr;
    for (Slot& x : slots_)
      if (x.kind == kind || std::string_view(x.kind) == kind) s = &x;
    if (s == nullptr) s = &slots_.emplace_back(Slot{kind, now});
    if (now - s->start >= interval_) {
      s->start = now;
      s->lines = 0;
    }
    if (s->lines >= kLinesPerKind) {
      ++s->held;
      return;
    }
    ++s->lines;
    line = text;
    if (s->held > 0) {
      line += " (" + std::to_string(s->held) + " more like this not shown)";
      s->held = 0;
    }
  }
  sink_(line);  // outside the lock: a sink may be slow
}

void send_refusal(int fd, const std::string& why) {
  WireHeader h{kErrorMagic, static_cast<uint32_t>(why.size()), 0};
  iovec iov[2] = {{&h, sizeof h}, {const_cast<char*>(why.data()), why.size()}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  (void)::sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
}

void refuse_client(int fd, const SockAddr& peer, const std::string& why, EventLimiter& log) {
  send_refusal(fd, why);
  ::close(fd);
  log.emit("refuse", "refused tcp client " + peer.to_string() + ": " + why);
}

AcceptErrors::Next AcceptErrors::failed(int err) {
  if (err == EAGAIN || err == EWOULDBLOCK) return Next::kEmpty;
  if (err == EINTR || err == ECONNABORTED || err == EPROTO) return Next::kRetry;
  if (accept_should_pause(err)) {
    if (!out_of_fds_)
      log_->emit("accept", "accept(" + name_ + ") failed: " + std::strerror(err) + "; not accepting for " +
                               std::to_string(kAcceptPause.count()) + " ms at a time until it succeeds");
    out_of_fds_ = true;
    return Next::kPause;
  }
  log_->emit("accept", "accept(" + name_ + ") failed: " + std::strerror(err));
  return Next::kFailed;
}

void AcceptErrors::accepted() {
  if (!out_of_fds_) return;
  out_of_fds_ = false;
  log_->emit("accept", "accept(" + name_ + ") works again");
}

std::string host_of(const SockAddr& peer) {
  std::string s = peer.to_string();
  auto colon = s.rfind(':');
  return colon == std::string::npos ? s : s.substr(0, colon);
}

}  // namespace dmx::mqueue
