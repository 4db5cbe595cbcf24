// dmx bench: which sizes to run and how many operations each gets.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/checked.h"
#include "core/units.h"
#include "tools/dmx/bench.h"

namespace dmx::bench {

uint32_t throughput_iters(uint64_t size) {
  uint64_t n = (uint64_t{4} << 30) / std::max<uint64_t>(size, 1);
  return static_cast<uint32_t>(std::clamp<uint64_t>(n, 8, 2000));
}

uint32_t latency_samples(double op_seconds) {
  if (!(op_seconds * kMinSamples > kLatencyBudgetSeconds)) return kMinSamples;  // also NaN, 0
  double fit = std::floor(kLatencyBudgetSeconds / op_seconds);
  return static_cast<uint32_t>(std::max<double>(fit, kMinLargeSamples));
}

Result<std::vector<uint64_t>> size_range(uint64_t min, uint64_t max, uint64_t factor) {
  if (min == 0) return Status(Code::kInvalidArgument, "-b/--min-bytes must be at least 1");
  if (min > max)
    return Status(Code::kInvalidArgument,
                  fmt::format("-b/--min-bytes {} is larger than -e/--max-bytes {}", min, max));
  if (factor < 2) return Status(Code::kInvalidArgument, fmt::format("-f/--step-factor must be 2 or more (got {})", factor));
  std::vector<uint64_t> out;
  for (uint64_t s = min; s <= max;) {
    out.push_back(s);
    auto next = checked_mul(s, factor);
    if (!next) break;  // past 2^64: max is reached
    s = *next;
  }
  return out;
}

Result<std::vector<uint64_t>> parse_size_list(const std::string& list) {
  std::vector<uint64_t> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    DMX_ASSIGN_OR_RETURN(uint64_t v, parse_size(item));
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace dmx::bench
