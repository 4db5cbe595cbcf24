// mqueue/host_centric.h — the baseline Lynx is measured against: a conventional host-centric
// server. A CPU server thread (one for UDP, one per TCP client) receives a request, copies it
// into the worker's memory, starts the worker for this one request (a kernel launch on a GPU, a
// wake-up of a worker thread on the CPU), waits, copies the response back and sends it.
// It runs the XOR app only. Same wire format and the same size checks as the dispatcher.
//
// Thread-safety: start/stop from one thread. stop() joins every thread within ~100 ms.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "dmx/memory.h"
#include "mqueue/layout.h"

namespace dmx::mqueue {

struct BaselineConfig {
  std::string udp, tcp;  // "host:port"; empty: none
  MemSpec memory;        // where the worker computes: host or cuda:N
  uint32_t max_request = 4096;
  uint32_t max_connections = 64;
  std::function<void(const std::string&)> on_event;  // drops; default stderr
};

class HostCentricServer {
 public:
  static Result<std::unique_ptr<HostCentricServer>> start(BaselineConfig config);
  ~HostCentricServer();
  std::string udp_address() const;
  std::string tcp_address() const;
  uint64_t requests() const;
  void stop();

  struct Impl;

 private:
  explicit HostCentricServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace dmx::mqueue
