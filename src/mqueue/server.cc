#include "mqueue/server.h"

namespace dmx::mqueue {

Result<std::unique_ptr<Server>> Server::start(ServerConfig config) {
  std::unique_ptr<Server> s(new Server());
  if (config.app == AppKind::kFaceVerify && config.geometry.call_slots == 0)
    return Status(Code::kInvalidArgument, "face verification needs client queues (call_slots > 0)");
  DMX_ASSIGN_OR_RETURN(s->queues_, QueueSet::create(config.geometry, config.memory));
  if (config.memory.kind == MemKind::kCuda) {
    if (config.stream_writes) {
      DMX_ASSIGN_OR_RETURN(auto writer, make_stream_writer(config.memory.device));
      s->queues_->set_writer(std::move(writer));
    }
    DMX_ASSIGN_OR_RETURN(s->gpu_, GpuWorkers::start(s->queues_.get(), config.app, config.gpu_threads));
  } else {
    DMX_ASSIGN_OR_RETURN(s->cpu_, CpuWorkers::start(s->queues_.get(), config.app, config.call_timeout));
  }
  DMX_ASSIGN_OR_RETURN(s->dispatcher_, Dispatcher::start(s->queues_.get(), std::move(config.dispatch)));
  return s;
}

Server::~Server() { (void)stop(); }

Status Server::stop() {
  if (stopped_) return Status();
  stopped_ = true;
  Status st;
  if (dispatcher_) st = dispatcher_->stop();
  if (cpu_) cpu_->stop();
  if (gpu_) {
    Status g = gpu_->stop();
    if (!g.ok()) {
      // The kernel may still touch the queues: leak them rather than free memory in use.
      (void)queues_.release();
      (void)gpu_.release();
      return g;
    }
  }
  return st;
}

}  // namespace dmx::mqueue
