// dmx/metrics.h — a context's cumulative counters and latency histograms, per transport.
//
// Context::metrics() returns a Metrics snapshot: plain values, safe to keep and to copy; any
// thread. Counters count from the context's creation and survive the endpoints that made them.
// An operation counts with a few atomic additions (no lock); a snapshot takes each live
// endpoint's lock briefly. It is not one instant: counters are read one after another while
// operations go on. docs/metrics.md says what each counter means; to_prometheus() writes them in
// the Prometheus text format.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "dmx/status.h"

namespace dmx {

// Operation kinds, the index of the per-kind arrays below.
inline constexpr std::array<const char*, 4> kMetricOps = {"send", "recv", "write", "read"};
inline constexpr size_t kMetricOpKinds = kMetricOps.size();
inline constexpr size_t kCodeCount = static_cast<size_t>(Code::kInternal) + 1;  // index: Code

// Operation latency, from the call that posted it to its completion, in log2 buckets: bucket i
// counts operations of at most 2^i microseconds (and more than 2^(i-1)); the last counts the rest.
struct LatencyHistogram {
  static constexpr size_t kBounds = 25;  // 1 us .. 2^24 us (16.8 s)
  std::array<uint64_t, kBounds + 1> buckets{};  // not cumulative; [kBounds]: above 2^24 us
  double sum_us = 0;
  uint64_t count() const;
};

struct TransportMetrics {
  std::string transport;  // "tcp", "shm", "cuda_ipc", "devmem"
  uint64_t bytes_sent = 0, bytes_received = 0;        // payload bytes this transport moved
  std::array<uint64_t, kMetricOpKinds> completed{};   // operations that succeeded, by kind
  std::array<std::array<uint64_t, kCodeCount>, kMetricOpKinds> failed{};  // by kind and Code
  std::array<LatencyHistogram, kMetricOpKinds> latency{};  // of the operations that succeeded
};

struct Metrics {
  std::vector<TransportMetrics> transports;  // one per transport, always all four, in that order
  const TransportMetrics* find(const std::string& transport) const;
};

// Prometheus text exposition format (version 0.0.4): HELP and TYPE lines, counters and histograms
// named dmx_*. Failure counts that are zero and histograms with no operation are left out.
std::string to_prometheus(const Metrics& m);

}  // namespace dmx
