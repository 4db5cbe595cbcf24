// to_prometheus (dmx/metrics.h): the Prometheus text exposition format, version 0.0.4.
#include <fmt/format.h>

#include "dmx/metrics.h"

namespace dmx {
namespace {

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

}  // namespace

std::string to_prometheus(const Metrics& m) {
  std::string out;
  header(out, "dmx_bytes_total", "counter", "Payload bytes moved by the transport (frame headers not counted).");
  for (const auto& t : m.transports) {
    out += fmt::format("dmx_bytes_total{{transport=\"{}\",direction=\"sent\"}} {}\n", t.transport, t.bytes_sent);
    out +=
        fmt::format("dmx_bytes_total{{transport=\"{}\",direction=\"received\"}} {}\n", t.transport, t.bytes_received);
  }
  header(out, "dmx_operations_total", "counter", "Operations that completed successfully.");
  for (const auto& t : m.transports)
    for (size_t op = 0; op < kMetricOpKinds; ++op)
      out += fmt::format("dmx_operations_total{{transport=\"{}\",op=\"{}\"}} {}\n", t.transport, kMetricOps[op],
                         t.completed[op]);
  header(out, "dmx_operations_failed_total", "counter", "Operations that completed with an error, by status code.");
  for (const auto& t : m.transports)
    for (size_t op = 0; op < kMetricOpKinds; ++op)
      for (size_t c = 0; c < kCodeCount; ++c)
        if (t.failed[op][c] > 0)
          out += fmt::format("dmx_operations_failed_total{{transport=\"{}\",op=\"{}\",code=\"{}\"}} {}\n", t.transport,
                             kMetricOps[op], code_name(static_cast<Code>(c)), t.failed[op][c]);
  const char* lat = "dmx_operation_latency_microseconds";
  header(out, lat, "histogram", "Time from posting an operation to its successful completion, in microseconds.");
  for (const auto& t : m.transports)
    for (size_t op = 0; op < kMetricOpKinds; ++op) {
      const LatencyHistogram& h = t.latency[op];
      uint64_t count = h.count();
      if (count == 0) continue;
      std::string labels = fmt::format("transport=\"{}\",op=\"{}\"", t.transport, kMetricOps[op]);
      uint64_t cumulative = 0;
      for (size_t b = 0; b < LatencyHistogram::kBounds; ++b) {
        cumulative += h.buckets[b];
        out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", lat, labels, uint64_t{1} << b, cumulative);
      }
      out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", lat, labels, count);
      out += fmt::format("{}_sum{{{}}} {}\n", lat, labels, h.sum_us);
      out += fmt::format("{}_count{{{}}} {}\n", lat, labels, count);
    }
  return out;
}

}  // namespace dmx
