// dmx bench --metrics-port: the context's metrics as Prometheus text on GET /metrics.
//
// Listens on 127.0.0.1 only: the page is unauthenticated and tells who moves how much; scrape it
// from another host through a tunnel or a proxy. One thread serves every connection with poll(),
// joined by the destructor. Every peer is bounded (docs/reliability.md, "Metrics port"):
// - at most kMaxConnections connections, kMaxConnectionsPerPeer per peer address: a new one
//   closes the oldest (of its address, else of all), so idle peers cannot lock a scrape out, and
//   the server never holds more than kMaxConnections + 2 descriptors;
// - the request head (metrics_request.h: at most 8 KiB, no body) must arrive within kHeadTimeout
//   of the accept, the reply must be taken within kReplyTimeout; one request per connection
//   (Connection: close), after which at most kLingerBytes are read and dropped within
//   kLingerTimeout so that the peer sees the reply rather than a reset;
// - accept() failing for lack of descriptors pauses accepting for kAcceptPause;
// - log lines a peer can cause are rate-limited (one per kind per 10 s).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "dmx/dmx.h"

namespace dmx::cli {

inline constexpr size_t kMaxConnections = 16;
inline constexpr size_t kMaxConnectionsPerPeer = 8;
inline constexpr std::chrono::milliseconds kHeadTimeout{5000};
inline constexpr std::chrono::milliseconds kReplyTimeout{10000};
inline constexpr std::chrono::milliseconds kLingerTimeout{1000};
inline constexpr size_t kLingerBytes = 64 * 1024;
inline constexpr std::chrono::milliseconds kAcceptPause{100};

class MetricsServer {
 public:
  // Serves `ctx`'s metrics on 127.0.0.1:`port` (0: a free port; see port()).
  static Result<std::unique_ptr<MetricsServer>> start(Context ctx, int port);
  ~MetricsServer();  // stops serving, closes every connection; returns once its thread has exited
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  int port() const { return port_; }

 private:
  struct Impl;
  MetricsServer(std::unique_ptr<Impl> impl, int port);
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace dmx::cli
