// rpc/server.h — the SplitRPC server over dmx.
//
// Each request is a 64-byte control header (to the CPU handler, in host memory) and a payload
// that dmx lands straight in the request area of the client's pool slot (posted receive, no
// host copy of our own); the orchestrator runs the service on the pool memory; the response
// payload is sent from the slot's response area. Clients get a partition of `slots` slots.
//
// Hostile peers: a malformed or oversized control header, a payload larger than a slot or its
// header says, a slot reused while busy, or a payload that does not follow its header within
// request_timeout gets the peer refused (a kRefused header, a warning naming the peer, the
// connection closed); other clients go on. Thread-safe; stop() (or destruction) joins every
// thread and closes every connection.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dmx/context.h"
#include "rpc/orchestrator.h"
#include "rpc/pool.h"

namespace dmx::rpc {

struct ServerConfig {
  PoolShape pool;
  OrchestratorConfig orchestration;
  Duration request_timeout = std::chrono::seconds(10);  // header to payload; also the work deadline
  // A client with no request in progress for this long gives its partition up (told why, closed)
  // when a new client finds every partition in use: idle clients cannot lock others out.
  Duration idle_evict_after = std::chrono::seconds(1);
  bool quiet = false;  // no warnings on stderr (tests that provoke them on purpose)
};

struct ServerStats {
  uint64_t accepted = 0, requests = 0, error_responses = 0, refused = 0, disconnects = 0;
  std::string last_refusal;  // "refused peer 127.0.0.1:4242: ..." (empty if none)
};

class ServerImpl;

class Server {
 public:
  ~Server();
  // Listens on `address` ("tcp://host:port"; port 0: any) with `ctx`.
  static Result<std::unique_ptr<Server>> start(Context ctx, const std::string& address, const ServerConfig& config);
  std::string address() const;
  ServerStats stats() const;
  void stop();

 private:
  explicit Server(std::unique_ptr<ServerImpl> impl);
  std::unique_ptr<ServerImpl> impl_;
};

}  // namespace dmx::rpc
