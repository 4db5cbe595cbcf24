// rpc/client.h — a SplitRPC client: one dmx endpoint, the slots the server's hello granted.
//
// submit() starts a call on a free slot: the 64-byte control header and the payload go as two
// sends; the response is copied into `resp` from a ring of receives. `done` runs exactly once, on a
// dmx thread (or the closing thread), after dmx has let go of `req` and `resp`: with the
// response size, the server's error, a timeout, or the connection's error. A slot whose call
// timed out stays reserved until the late response has been drained, so it never lands in a
// later call's buffer. Thread-safe. Destroying the client closes it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "dmx/context.h"
#include "rpc/header.h"

namespace dmx::rpc {

class ClientImpl;

class Client {
 public:
  using Done = std::function<void(const Status& status, size_t resp_bytes)>;
  ~Client();
  // Connects and waits up to `timeout` for the server's hello.
  static Result<std::unique_ptr<Client>> connect(Context ctx, const std::string& address,
                                                 Duration timeout = std::chrono::seconds(10));
  uint32_t slots() const;
  uint32_t slot_size() const;
  std::string transport() const;  // the dmx data path in use ("tcp", "shm", ...)
  // kResourceExhausted when every slot is busy; kInvalidArgument when req exceeds a slot;
  // the connection's error once it failed. Otherwise `done` will run.
  Status submit(Method method, const MemRegion& req, const MemRegion& resp, Duration timeout, Done done);
  // Blocking call with a deadline; the response size.
  Result<size_t> call(Method method, const MemRegion& req, const MemRegion& resp, Duration timeout);
  Status close();

 private:
  explicit Client(std::shared_ptr<ClientImpl> impl);
  std::shared_ptr<ClientImpl> impl_;
};

}  // namespace dmx::rpc
