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
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.h"
#include "dmx/endpoint.h"
#include "dmx/metrics.h"
#include "engine/transports.h"

namespace dmx {

class EndpointImpl;

// Index of a transport in Metrics::transports (0: tcp, the streams).
using MetricTransport = size_t;
inline constexpr size_t kMetricTransports = 17;  // tcp and up to 16 registered transports

class MetricsRegistry {
 public:
  // Rows: tcp, then each transport's metric_name() once (at most kMetricTransports in all).
  explicit MetricsRegistry(const TransportList& transports);
  // The row of a transport (by its name or its metric name); unknown names count as tcp.
  MetricTransport index_of(std::string_view name) const;
  // One completed operation. `op`: index into kMetricOps. Any thread.
  void record(MetricTransport t, size_t op, Code code, Clock::duration latency) {
    PerTransport& p = t_[t];
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

  // The endpoint's byte counters count from here (once its streams exist) ... `control`: the row
  // of stream 0's bytes.
  void add_endpoint(const EndpointImpl* ep, MetricTransport control);
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
  std::vector<std::string> names_;                            // rows
  std::vector<std::pair<std::string, MetricTransport>> alias_;  // transport name -> row
  std::array<PerTransport, kMetricTransports> t_{};
  void add_bytes(const EndpointStats& s, MetricTransport control, Metrics& m) const;

  mutable std::mutex mu_;  // guards live_, gone_
  std::vector<std::pair<const EndpointImpl*, MetricTransport>> live_;
  Metrics gone_;  // bytes of the endpoints removed
};

}  // namespace dmx
