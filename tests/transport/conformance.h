// The transport conformance suite's view of a transport: how to make a context that uses it, the
// memory it carries, and how to see that it did. Every transport in harnesses() runs the whole
// suite (conformance_test.cc); one that cannot run here is skipped with its reason.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dmx/dmx.h"

namespace dmx::test {

struct Harness {
  std::string name;  // the transport: "tcp", "shm", "devmem", "cuda_ipc", "loop"
  MemSpec mem;       // memory both sides use, so that bulk data takes this transport
  // Empty when the transport can run here; else why not, as "<cause>: <reason>" (test_env.h).
  std::function<std::string()> unavailable;
  // A context that uses the transport. `host` tells two "hosts" apart where the transport needs
  // one of its own per side (devmem's NIC double); `options` are the test's own settings.
  std::function<Result<Context>(int host, Options options)> make_context;
  // The name of the payload path in EndpointStats::paths that carries bulk data; empty for tcp,
  // whose bytes travel on the streams themselves.
  std::string path;
  // Empty when a child forked by the test may use the transport; else why not (that test skips).
  std::string no_fork;
};

// Every transport the suite runs over (tests/transport/conformance_harnesses.cc).
const std::vector<Harness>& harnesses();

}  // namespace dmx::test
