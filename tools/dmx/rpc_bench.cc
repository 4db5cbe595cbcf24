#include "tools/dmx/rpc_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "rpc/client.h"
#include "rpc/grpc/baseline.h"
#include "rpc/service.h"

namespace dmx::cli::rpcbench {
namespace {

using Clock = std::chrono::steady_clock;

// One call slot of the closed loop: its buffers, the expected response, its latencies.
struct Lane {
  std::vector<unsigned char> req, resp, expect;
  std::vector<float> lat_us;
  uint64_t errors = 0, wrong = 0;
  Status first_error;
  Clock::time_point t0;
};

void fill(Lane& l, const Load& load, uint64_t seed) {
  std::mt19937_64 rng(seed);
  l.req.resize(load.payload);
  for (auto& b : l.req) b = static_cast<unsigned char>(rng());
  if (load.method == rpc::Method::kMlp)  // finite floats: the MLP's inputs
    for (size_t i = 0; i + 4 <= l.req.size(); i += 4) {
      float f = static_cast<float>(rng() % 2000) / 1000.0f - 1.0f;
      std::memcpy(&l.req[i], &f, 4);
    }
  auto n = rpc::response_size(load.method, static_cast<uint32_t>(load.payload));
  l.resp.resize(n.ok() ? *n : load.payload);
  l.expect.resize(l.resp.size());
  if (n.ok()) rpc::run_host(load.method, l.req.data(), l.req.size(), l.expect.data());
}

Row summarize(std::vector<Lane>& lanes, const Load& load, double seconds) {
  Row r;
  r.payload_bytes = load.payload;
  std::vector<float> all;
  for (auto& l : lanes) {
    all.insert(all.end(), l.lat_us.begin(), l.lat_us.end());
    r.errors += l.errors;
    r.wrong += l.wrong;
    if (r.first_error.empty() && !l.first_error.ok()) r.first_error = l.first_error.to_string();
  }
  r.requests = all.size();
  r.req_per_s = seconds > 0 ? static_cast<double>(all.size()) / seconds : 0;
  if (!all.empty()) {
    std::sort(all.begin(), all.end());
    r.p50_us = all[all.size() / 2];
    r.p99_us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  }
  return r;
}

}  // namespace

Result<Row> run_dmx(Context ctx, const std::string& address, const Load& load) {
  std::vector<std::unique_ptr<rpc::Client>> clients;
  for (uint32_t c = 0; c < load.clients; ++c) {
    DMX_ASSIGN_OR_RETURN(auto cl, rpc::Client::connect(ctx, address));
    if (cl->slots() < load.depth)
      return Status(Code::kInvalidArgument, "--depth exceeds the server's slots per client");
    clients.push_back(std::move(cl));
  }
  std::vector<Lane> lanes(load.clients * load.depth);
  for (size_t i = 0; i < lanes.size(); ++i) fill(lanes[i], load, 1000 + i);
  std::atomic<bool> stop{false};
  std::atomic<int> running{0};
  Clock::time_point measure_from = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                      std::chrono::duration<double>(load.warmup));
  const MemSpec host{};
  // Each completion records its latency and starts the next call on the same lane.
  std::function<void(size_t)> issue = [&](size_t i) {
    Lane& l = lanes[i];
    rpc::Client& cl = *clients[i / load.depth];
    l.t0 = Clock::now();
    ++running;
    Status s = cl.submit(load.method, {l.req.data(), l.req.size(), host}, {l.resp.data(), l.resp.size(), host},
                         std::chrono::seconds(10), [&, i](const Status& st, size_t n) {
                           Lane& ln = lanes[i];
                           auto now = Clock::now();
                           if (!st.ok()) {
                             if (ln.first_error.ok()) ln.first_error = st;
                             ++ln.errors;
                           } else {
                             if (load.verify && (n != ln.expect.size() || ln.resp != ln.expect)) ++ln.wrong;
                             if (now >= measure_from)
                               ln.lat_us.push_back(std::chrono::duration<float, std::micro>(now - ln.t0).count());
                           }
                           bool again = st.ok() && !stop.load();
                           --running;
                           if (again) issue(i);
                         });
    if (!s.ok()) {
      --running;
      if (l.first_error.ok()) l.first_error = s;
      ++l.errors;
    }
  };
  for (size_t i = 0; i < lanes.size(); ++i) issue(i);
  std::this_thread::sleep_until(measure_from);
  auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(load.seconds));
  stop = true;
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  auto deadline = Clock::now() + std::chrono::seconds(15);
  while (running.load() > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  Row r = summarize(lanes, load, secs);  // calls ending after the stop count (latency only)
  r.transport = clients.empty() ? "" : clients[0]->transport();
  for (auto& c : clients) (void)c->close();
  return r;
}

Result<Row> run_grpc(const std::string& target, const Load& load) {
  DMX_RETURN_IF_ERROR(rpc::grpcb::available());
  std::vector<std::unique_ptr<rpc::grpcb::Client>> clients;
  for (uint32_t c = 0; c < load.clients; ++c) {
    DMX_ASSIGN_OR_RETURN(auto cl, rpc::grpcb::Client::connect(target));
    clients.push_back(std::move(cl));
  }
  std::vector<Lane> lanes(load.clients * load.depth);
  for (size_t i = 0; i < lanes.size(); ++i) fill(lanes[i], load, 1000 + i);
  std::atomic<bool> stop{false};
  Clock::time_point measure_from = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                      std::chrono::duration<double>(load.warmup));
  // gRPC's synchronous stub blocks: one thread per call in flight.
  std::vector<std::thread> threads;
  for (size_t i = 0; i < lanes.size(); ++i)
    threads.emplace_back([&, i] {
      Lane& l = lanes[i];
      rpc::grpcb::Client& cl = *clients[i / load.depth];
      while (!stop.load()) {
        auto t0 = Clock::now();
        auto n = cl.call(load.method, l.req.data(), l.req.size(), l.resp.data(), l.resp.size(), std::chrono::seconds(10));
        auto now = Clock::now();
        if (!n.ok()) {
          if (l.first_error.ok()) l.first_error = n.status();
          ++l.errors;
          break;
        }
        if (load.verify && (*n != l.expect.size() || l.resp != l.expect)) ++l.wrong;
        if (now >= measure_from) l.lat_us.push_back(std::chrono::duration<float, std::micro>(now - t0).count());
      }
    });
  std::this_thread::sleep_until(measure_from);
  auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(load.seconds));
  stop = true;
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  for (auto& t : threads) t.join();
  Row r = summarize(lanes, load, secs);
  r.transport = "grpc (http2/tcp)";
  return r;
}

}  // namespace dmx::cli::rpcbench
