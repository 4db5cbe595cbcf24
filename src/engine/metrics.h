// The context's metrics (dmx/metrics.h): operations count themselves as they complete, with
// relaxed atomic additions (no lock, no allocation); bytes are the endpoints' own statistics —
// read from live endpoints, and kept when an endpoint stops — so nothing counts them twice.
//
// Lock order: this registry's mutex -> an endpoint's mutex (snapshot() reads endpoint stats()).
// So add_endpoint/remove_endpoint are called without the endpoint's mutex.
#pragma once

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string_view>
#include <vector>

#include "core/clock.h"
#include "dmx/endpoint.h"
#include "dmx/metrics.h"

namespace dmx {

class EndpointImpl;

// Index of a transport in Metrics::transports.
enum class MetricTransport : uint8_t { kTcp, kShm, kCudaIpc, kDevmem };
inline constexpr size_t kMetricTransports = 4;
// "tcp", "shm", "cuda_ipc", "devmem"; a conduit's "shm pipe" is shm. Unknown names count as tcp.
MetricTransport metric_transport(std::string_view name);

class MetricsRegistry {
 public:
  MetricsRegistry();
  // One completed operation. `op`: index into kMetricOps. Any thread.
  void record(MetricTransport t, size_t op, Code code, Clock::duration latency) {
    PerTransport& p = t_[static_cast<size_t>(t)];
    if (code != Code::kOk) {
      p.failed[op][static_cast<size_t>(code)].fetch_add(1, std::memory_order_relaxed);
      return;
    }
    auto ns = static_cast<uint64_t>(std::max<int64_t>(0, std::chrono::nanoseconds(latency).count()));
    p.latency[op].buckets[bucket_of(ns)].fetch_add(1, std::memory_order_relaxed);
    p.latency[op].sum_ns.fetch_add(ns, std::memory_order_relaxed);
  }
  // The smallest i with ns <= 2^i us, or LatencyHistogram::kBounds when larger than all.
  static size_t bucket_of(uint64_t ns);

  // The endpoint's byte counters count from here (once its streams exist) ...
  void add_endpoint(const EndpointImpl* ep);
  // ... until here, which keeps `last` (its final statistics). Later calls do nothing.
  void remove_endpoint(const EndpointImpl* ep, const EndpointStats& last);

  Metrics snapshot() const;

 private:
  struct Histogram {
    std::array<std::atomic<uint64_t>, LatencyHistogram::kBounds + 1> buckets{};
    std::atomic<uint64_t> sum_ns{0};
  };
  struct PerTransport {  // operations completed are the histogram's count
    std::array<std::array<std::atomic<uint64_t>, kCodeCount>, kMetricOpKinds> failed{};
    std::array<Histogram, kMetricOpKinds> latency{};
  };
  std::array<PerTransport, kMetricTransports> t_{};

  mutable std::mutex mu_;  // guards live_, gone_
  std::vector<const EndpointImpl*> live_;
  Metrics gone_;  // bytes of the endpoints removed
};

}  // namespace dmx
