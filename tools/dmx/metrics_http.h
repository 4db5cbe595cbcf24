// dmx bench --metrics-port: the context's metrics as Prometheus text on GET /metrics.
//
// Listens on 127.0.0.1 only: the page is unauthenticated and tells who moves how much; scrape it
// from another host through a tunnel or a proxy. One server thread (and cpp-httplib's one worker),
// both joined by the destructor. Built only with cpp-httplib (DMX_ENABLE_HTTPLIB); without it,
// start() says so.
#pragma once

#include <memory>

#include "dmx/dmx.h"

namespace dmx::cli {

class MetricsServer {
 public:
  // Serves `ctx`'s metrics on 127.0.0.1:`port` (0: a free port; see port()).
  static Result<std::unique_ptr<MetricsServer>> start(Context ctx, int port);
  ~MetricsServer();  // stops serving; returns once its threads have exited
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
