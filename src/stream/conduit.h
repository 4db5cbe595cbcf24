// What a stream's bytes travel over: a connected socket, or — between two processes of one host —
// a shared-memory pipe that the engine adapts to this interface (the endpoint's control stream).
//
// Non-blocking, like a socket with MSG_DONTWAIT. Threading: the stream's worker calls everything
// except shutdown(), which any thread may call.
#pragma once

#include <poll.h>
#include <sys/uio.h>

#include <span>
#include <string>

#include "core/sys.h"
#include "dmx/status.h"

namespace dmx::stream {

class Conduit {
 public:
  virtual ~Conduit() = default;
  // Bytes written (0: no room now). An error means the conduit is broken.
  virtual Result<size_t> write(std::span<const iovec> buffers) = 0;
  // Bytes read (0: nothing there now). kPeerFailed once the peer has closed and all it sent was read.
  virtual Result<size_t> read(void* dst, size_t n) = 0;
  // The same, scattered over `buffers` in order (an inline table's pieces); by default into the
  // first alone.
  virtual Result<size_t> readv(std::span<const iovec> buffers) {
    return buffers.empty() ? Result<size_t>(size_t{0}) : read(buffers[0].iov_base, buffers[0].iov_len);
  }
  // Before the worker sleeps: fills at most 2 pollfds to wait on for input (and for room when
  // `want_room`) and returns how many; -1 when there is something to do already (do not sleep).
  virtual int prepare_sleep(bool want_room, pollfd* fds) = 0;
  virtual void after_sleep() = 0;
  // Any thread, idempotent: the peer learns now that this side is done.
  virtual void shutdown() = 0;
  // "tcp" or "shm pipe": for messages and statistics.
  virtual const char* kind() const = 0;
  // Bytes of ours the peer's host has acknowledged so far (TCP: tcpi_bytes_acked), or 0 when the
  // conduit cannot tell: a peer that takes our data is alive though it sends nothing back.
  virtual uint64_t acked_bytes() const { return 0; }
};

// A connected, non-blocking stream socket.
class SocketConduit final : public Conduit {
 public:
  explicit SocketConduit(UniqueFd fd) : fd_(std::move(fd)) {}
  Result<size_t> write(std::span<const iovec> buffers) override;
  Result<size_t> read(void* dst, size_t n) override;
  Result<size_t> readv(std::span<const iovec> buffers) override;
  int prepare_sleep(bool want_room, pollfd* fds) override;
  void after_sleep() override {}
  void shutdown() override;
  const char* kind() const override { return "tcp"; }
  uint64_t acked_bytes() const override;

 private:
  UniqueFd fd_;
  uint64_t written_ = 0;  // bytes write() took
};

}  // namespace dmx::stream
