// dmx bench --metrics-port (metrics_http.h): an httplib server on its own, joined thread.
#include "tools/dmx/metrics_http.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <thread>

#ifdef DMX_HAVE_HTTPLIB
#include <httplib.h>
#endif

namespace dmx::cli {

#ifdef DMX_HAVE_HTTPLIB

struct MetricsServer::Impl {
  httplib::Server server;
  std::thread thread;
  std::atomic<bool> exited{false};
};

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(Context ctx, int port) {
  if (port < 0 || port > 65535)
    return Status(Code::kInvalidArgument, fmt::format("--metrics-port {}: not a port", port));
  auto impl = std::make_unique<Impl>();
  impl->server.new_task_queue = [] { return new httplib::ThreadPool(1); };  // scrapes are rare
  impl->server.Get("/metrics", [ctx](const httplib::Request&, httplib::Response& res) {
    res.set_content(to_prometheus(ctx.metrics()), "text/plain; version=0.0.4; charset=utf-8");
  });
  int bound = port == 0 ? impl->server.bind_to_any_port("127.0.0.1")
                        : (impl->server.bind_to_port("127.0.0.1", port) ? port : -1);
  if (bound <= 0)
    return Status(Code::kIo, fmt::format("--metrics-port: cannot listen on 127.0.0.1:{} (in use?)", port));
  Impl* p = impl.get();
  p->thread = std::thread([p] {
    p->server.listen_after_bind();
    p->exited.store(true);
  });
  // Server::stop() does nothing until the accept loop runs: wait for it, so the destructor's stop
  // cannot be lost (and the join hang).
  while (!p->server.is_running() && !p->exited.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl), bound));
}

MetricsServer::~MetricsServer() {
  impl_->server.stop();
  impl_->thread.join();
}

#else

struct MetricsServer::Impl {};

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(Context, int) {
  return Status(Code::kUnavailable,
                "--metrics-port: dmx was built without cpp-httplib (install libcpp-httplib-dev and rebuild)");
}

MetricsServer::~MetricsServer() = default;

#endif

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl, int port) : impl_(std::move(impl)), port_(port) {}

}  // namespace dmx::cli
