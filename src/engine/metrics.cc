#include "engine/metrics.h"

#include <algorithm>
#include <bit>

#include "engine/endpoint_impl.h"

namespace dmx {
namespace {

constexpr const char* kTransportNames[kMetricTransports] = {"tcp", "shm", "cuda_ipc", "devmem"};

Metrics empty_metrics() {
  Metrics m;
  for (const char* name : kTransportNames) m.transports.push_back(TransportMetrics{name});
  return m;
}

// Stream bytes count under the stream's conduit (stream 0 may be the shm pipe), path bytes under
// the path.
void add_bytes(const EndpointStats& s, Metrics& m) {
  for (size_t i = 0; i < s.stream_bytes_sent.size(); ++i) {
    auto& t = m.transports[static_cast<size_t>(metric_transport(i == 0 ? s.control_stream : "tcp"))];
    t.bytes_sent += s.stream_bytes_sent[i];
    if (i < s.stream_bytes_received.size()) t.bytes_received += s.stream_bytes_received[i];
  }
  for (const auto& p : s.paths) {
    auto& t = m.transports[static_cast<size_t>(metric_transport(p.name))];
    t.bytes_sent += p.bytes_sent;
    t.bytes_received += p.bytes_received;
  }
}

}  // namespace

MetricTransport metric_transport(std::string_view name) {
  if (name == "shm" || name == "shm pipe") return MetricTransport::kShm;
  if (name == "cuda_ipc") return MetricTransport::kCudaIpc;
  if (name == "devmem") return MetricTransport::kDevmem;
  return MetricTransport::kTcp;
}

size_t MetricsRegistry::bucket_of(uint64_t ns) {
  uint64_t us = (ns + 999) / 1000;  // ns <= 2^i us  <=>  ceil(ns / 1000) <= 2^i
  size_t i = us <= 1 ? 0 : static_cast<size_t>(std::bit_width(us - 1));
  return std::min(i, LatencyHistogram::kBounds);
}

MetricsRegistry::MetricsRegistry() : gone_(empty_metrics()) {}

void MetricsRegistry::add_endpoint(const EndpointImpl* ep) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.push_back(ep);
}

void MetricsRegistry::remove_endpoint(const EndpointImpl* ep, const EndpointStats& last) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find(live_.begin(), live_.end(), ep);
  if (it == live_.end()) return;
  live_.erase(it);
  add_bytes(last, gone_);
}

Metrics MetricsRegistry::snapshot() const {
  Metrics m;
  {
    std::lock_guard<std::mutex> lock(mu_);
    m = gone_;
    for (const EndpointImpl* ep : live_) add_bytes(ep->stats(), m);
  }
  for (size_t t = 0; t < kMetricTransports; ++t) {
    const PerTransport& p = t_[t];
    TransportMetrics& out = m.transports[t];
    for (size_t op = 0; op < kMetricOpKinds; ++op) {
      for (size_t c = 0; c < kCodeCount; ++c) out.failed[op][c] = p.failed[op][c].load(std::memory_order_relaxed);
      const Histogram& h = p.latency[op];
      for (size_t b = 0; b < h.buckets.size(); ++b)
        out.latency[op].buckets[b] = h.buckets[b].load(std::memory_order_relaxed);
      out.latency[op].sum_us = static_cast<double>(h.sum_ns.load(std::memory_order_relaxed)) * 1e-3;
      out.completed[op] = out.latency[op].count();
    }
  }
  return m;
}

// --- dmx/metrics.h ---

uint64_t LatencyHistogram::count() const {
  uint64_t n = 0;
  for (uint64_t b : buckets) n += b;
  return n;
}

const TransportMetrics* Metrics::find(const std::string& transport) const {
  for (const auto& t : transports)
    if (t.transport == transport) return &t;
  return nullptr;
}

}  // namespace dmx
