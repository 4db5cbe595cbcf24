// Parsing and printing of sizes ("4K", "1M", "256MiB") and durations ("250ms", "2s").
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "dmx/status.h"

namespace dmx {

// Binary multiples: K=1024, M, G, T; optional "B"/"iB" suffix; case-insensitive.
Result<uint64_t> parse_size(std::string_view text);
// "1.5 GiB", "4 KiB", "17 B"
std::string format_size(uint64_t bytes);
// A bare number is milliseconds; suffixes us, ms, s, m.
Result<std::chrono::microseconds> parse_duration(std::string_view text);
Result<int64_t> parse_int(std::string_view text);
Result<bool> parse_bool(std::string_view text);

}  // namespace dmx
