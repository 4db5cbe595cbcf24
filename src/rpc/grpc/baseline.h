// rpc/grpc/baseline.h — the host-centric gRPC baseline: a synchronous gRPC server doing the same
// work as the SplitRPC server, copying each request's payload into the work memory (GPU memory
// with cuda:N) and the response back, per request, as host-centric servers do.
//
// Built only where gRPC was found at configure time; otherwise available() says why and the
// factories return that. Server and Client are thread-safe (gRPC's own threads serve).
#pragma once

#include <memory>
#include <string>

#include "dmx/memory.h"
#include "dmx/request.h"
#include "rpc/header.h"

namespace dmx::rpc::grpcb {

Status available();

class Server {
 public:
  virtual ~Server() = default;
  // Listens on `host_port` ("127.0.0.1:0": any port) with `threads` handler threads.
  static Result<std::unique_ptr<Server>> start(const std::string& host_port, MemSpec mem, uint32_t slot_size,
                                               int threads);
  virtual std::string target() const = 0;  // "127.0.0.1:port"
  virtual void stop() = 0;
};

class Client {
 public:
  virtual ~Client() = default;
  static Result<std::unique_ptr<Client>> connect(const std::string& target);
  // One blocking unary call; the response size (at most `cap`, else kTruncated).
  virtual Result<size_t> call(Method method, const void* req, size_t len, void* resp, size_t cap,
                              Duration timeout) = 0;
};

}  // namespace dmx::rpc::grpcb
