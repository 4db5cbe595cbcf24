// mqueue/load.h — a closed-loop load generator for Lynx-wire servers (tests, the bench, the
// example): `clients` sockets, each with one request outstanding, fresh random payloads, and
// every response checked byte for byte.
//
// Runs on the calling thread; every wait has the per-request timeout. A UDP request without an
// answer in time counts as lost and the client goes on; a TCP client that times out or reads
// a bad frame counts it and reconnects.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "dmx/options.h"
#include "dmx/request.h"
#include "dmx/status.h"

namespace dmx::mqueue {

struct LoadConfig {
  std::string address;  // "host:port"; "tcp://host:port" for the dmx faces
  bool udp = true;
  // How the clients speak: Lynx's wire over sockets (`udp` picks which), or as dmx endpoints of one
  // Context (dmx_options): two-sided messages, or each its own remote queue (one-sided writes).
  enum class Face : uint8_t { kSocket, kDmx, kRemote };
  Face face = Face::kSocket;
  Options dmx_options;
  // kRemote: requests each client keeps outstanding in its queue (at most its slots); 1 otherwise.
  uint32_t depth = 1;
  uint32_t clients = 4;
  uint64_t requests = 1000;  // in all; ignored when duration > 0
  Duration duration{0};      // run this long instead
  std::vector<uint32_t> sizes = {64};  // payload sizes, used in turn
  Duration timeout = std::chrono::seconds(1);
  uint64_t seed = 1;
  // Fills a request of the given size (default: random bytes). Sizes it changes are kept.
  std::function<void(std::vector<uint8_t>& req, uint64_t index)> make;
  // Whether `resp` is the right answer to `req` (default: every byte XOR kXorKey).
  std::function<bool(std::span<const uint8_t> req, std::span<const uint8_t> resp)> check;
};

struct LoadResult {
  uint64_t sent = 0, ok = 0, bad = 0, lost = 0;
  double seconds = 0, client_cpu_seconds = 0;
  std::vector<double> latency_us;  // of the ok responses
  std::string first_error;         // what the first bad or lost response was
  double percentile(double p) const;  // of latency_us; 0 when empty
};

Result<LoadResult> run_load(const LoadConfig& config);
// CPU seconds the calling thread has used (CLOCK_THREAD_CPUTIME_ID): a load's client cost.
double thread_cpu_seconds();
// The dmx faces of run_load (load_dmx.cc). A client whose answer is late or whose endpoint failed
// counts it as lost and connects anew.
Result<LoadResult> run_dmx_load(const LoadConfig& config);

}  // namespace dmx::mqueue
