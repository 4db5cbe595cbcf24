#include "transport/shm/control_pipe.h"

#include <fmt/format.h>

namespace dmx {
namespace {

// shm::ShmPipe seen as a stream's conduit.
class PipeConduit final : public stream::Conduit {
 public:
  explicit PipeConduit(std::unique_ptr<shm::ShmPipe> pipe) : pipe_(std::move(pipe)) {}
  Result<size_t> write(std::span<const iovec> buffers) override { return local(pipe_->write(buffers)); }
  Result<size_t> read(void* dst, size_t n) override { return local(pipe_->read(dst, n)); }
  int prepare_sleep(bool want_room, pollfd* fds) override {
    if (!pipe_->arm(want_room)) return -1;
    return pipe_->pollfds(fds);
  }
  void after_sleep() override { pipe_->disarm(); }
  void shutdown() override { pipe_->shutdown(); }
  const char* kind() const override { return "shm pipe"; }

 private:
  // The stream names the peer by its network address; the pipe's "pid N" stays in the text.
  static Result<size_t> local(Result<size_t> r) {
    if (r.ok()) return r;
    return Status(r.status().code(), r.status().message());
  }

  std::unique_ptr<shm::ShmPipe> pipe_;
};

}  // namespace

Result<std::unique_ptr<stream::Conduit>> make_control_pipe(UnixChannel channel, bool creator, Deadline deadline) {
  Result<std::unique_ptr<shm::ShmPipe>> pipe = Status(Code::kInternal, "unset");
  if (creator) {
    shm::PipeOptions o;
    o.ring_bytes = kControlPipeBytes;
    pipe = shm::ShmPipe::create(std::move(channel), o, deadline);
  } else {
    pipe = shm::ShmPipe::accept(std::move(channel), deadline);
  }
  if (!pipe.ok()) return Status(pipe.status().code(), fmt::format("control pipe: {}", pipe.status().message()));
  return std::unique_ptr<stream::Conduit>(std::make_unique<PipeConduit>(std::move(*pipe)));
}

}  // namespace dmx
