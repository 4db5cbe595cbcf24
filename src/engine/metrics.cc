#include "engine/metrics.h"

#include <algorithm>
#include <bit>

#include "engine/endpoint/endpoint_impl.h"

namespace dmx {
namespace {

Metrics empty_metrics(const std::vector<std::string>& names) {
  Metrics m;
  for (const auto& name : names) m.transports.push_back(TransportMetrics{name});
  return m;
}

}  // namespace

MetricTransport MetricsRegistry::index_of(std::string_view name) const {
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name) return i;
  for (const auto& [alias, row] : alias_)
    if (alias == name) return row;
  return 0;
}

// Stream bytes count under the stream's conduit (stream 0 may be the shm pipe), path bytes under
// the path.
void MetricsRegistry::add_bytes(const EndpointStats& s, MetricTransport control, Metrics& m) const {
  for (size_t i = 0; i < s.stream_bytes_sent.size(); ++i) {
    auto& t = m.transports[i == 0 ? control : 0];
    t.bytes_sent += s.stream_bytes_sent[i];
    if (i < s.stream_bytes_received.size()) t.bytes_received += s.stream_bytes_received[i];
  }
  for (const auto& p : s.paths) {
    auto& t = m.transports[index_of(p.name)];
    t.bytes_sent += p.bytes_sent;
    t.bytes_received += p.bytes_received;
  }
}

size_t MetricsRegistry::bucket_of(uint64_t ns) {
  uint64_t us = (ns + 999) / 1000;  // ns <= 2^i us  <=>  ceil(ns / 1000) <= 2^i
  size_t i = us <= 1 ? 0 : static_cast<size_t>(std::bit_width(us - 1));
  return std::min(i, LatencyHistogram::kBounds);
}

MetricsRegistry::MetricsRegistry(const TransportList& transports) {
  names_ = metric_names(transports);
  names_.resize(std::min(names_.size(), kMetricTransports));
  for (const auto& t : transports) alias_.emplace_back(std::string(t->name()), index_of(t->metric_name()));
  gone_ = empty_metrics(names_);
}

void MetricsRegistry::add_endpoint(const EndpointImpl* ep, MetricTransport control) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.emplace_back(ep, control);
}

void MetricsRegistry::remove_endpoint(const EndpointImpl* ep, const EndpointStats& last) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(live_.begin(), live_.end(), [ep](const auto& l) { return l.first == ep; });
  if (it == live_.end()) return;
  MetricTransport control = it->second;
  live_.erase(it);
  add_bytes(last, control, gone_);
}

Metrics MetricsRegistry::snapshot() const {
  Metrics m;
  {
    std::lock_guard<std::mutex> lock(mu_);
    m = gone_;
    for (const auto& [ep, control] : live_) add_bytes(ep->stats(), control, m);
  }
  for (size_t t = 0; t < names_.size(); ++t) {
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
