// mqueue/host_centric.h — the baseline Lynx is measured against: a conventional host-centric
// server. A CPU server thread (a pool of udp_threads for UDP, all reading the one socket; one per
// TCP client) receives a request, copies it into the worker's memory, starts the worker for this one request (a kernel launch on a GPU, a
// wake-up of a worker thread on the CPU), waits, copies the response back and sends it.
// It runs the XOR app only. Same wire format, the same size checks and the same admission rules
// as the dispatcher: connections bounded in all and per address (refused with an error frame
// saying why), an idle deadline and a whole-request deadline, accepting paused when out of fds,
// event lines rate-limited. A finished connection's threads are joined by the accept thread.
//
// Thread-safety: start/stop from one thread. stop() joins every thread: within ~100 ms, or up to
// the 5 s send timeout for a connection whose client does not read its answers.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dmx/memory.h"
#include "dmx/request.h"
#include "mqueue/layout.h"

namespace dmx::mqueue {

struct BaselineConfig {
  std::string udp, tcp;  // "host:port"; empty: none
  MemSpec memory;        // where the worker computes: host or cuda:N
  // UDP server threads, each with a worker of its own, all reading the one socket: give it as
  // many as the Lynx server has workers (GPU blocks or CPU threads), so that both sides get the
  // same parallelism (one thread serving every datagram in turn flatters Lynx).
  uint32_t udp_threads = 2;
  uint32_t max_request = 4096;
  uint32_t max_connections = 64;   // TCP clients at once (two threads each); beyond, refused
  uint32_t max_per_address = 16;   // from one address; below max_connections, as the dispatcher's
  Duration idle_timeout = std::chrono::seconds(30);     // as DispatcherConfig::idle_timeout
  Duration request_timeout = std::chrono::seconds(10);  // a request begun must be whole by then
  std::function<void(const std::string&)> on_event;  // drops, refusals; rate-limited; default stderr
};

struct BaselineStats {
  uint64_t accepted = 0;  // TCP clients admitted
  uint64_t requests = 0, refused_clients = 0, dropped_clients = 0, idle_closed = 0, accept_pauses = 0;
  uint32_t connections = 0;  // open now
  std::vector<uint64_t> udp_served;  // requests each UDP server thread answered
};

class HostCentricServer {
 public:
  static Result<std::unique_ptr<HostCentricServer>> start(BaselineConfig config);
  ~HostCentricServer();
  std::string udp_address() const;
  std::string tcp_address() const;
  uint64_t requests() const;
  BaselineStats stats() const;
  void stop();

  struct Impl;

 private:
  explicit HostCentricServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace dmx::mqueue
