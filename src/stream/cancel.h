// Cancelling a thread's blocking socket waits (socket.cc: connect_to, send_exact, recv_exact, and so
// the handshake's send_frame / recv_frame). While a CancelWaits lives on a thread, each such wait of
// that thread also ends, with Code::kCancelled, once `fd` is readable: an eventfd that another thread
// writes to when the work is no longer wanted (the reconnect thread's dials, endpoint/reconnect.cc).
// Not thread-safe itself: made and destroyed on the thread whose waits it cancels.
#pragma once

namespace dmx::stream {

class CancelWaits {
 public:
  explicit CancelWaits(int fd);  // -1: nothing cancels
  ~CancelWaits();
  CancelWaits(const CancelWaits&) = delete;
  CancelWaits& operator=(const CancelWaits&) = delete;

 private:
  int previous_;
};

}  // namespace dmx::stream
