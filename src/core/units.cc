#include "core/units.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>

namespace dmx {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Splits "123abc" into 123 and "abc".
Result<std::pair<double, std::string>> split_number(std::string_view text, std::string_view what) {
  text = trim(text);
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return Status(Code::kInvalidArgument, fmt::format("'{}' is not a {}", text, what));
  double value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + i, value);
  if (ec != std::errc() || ptr != text.data() + i)
    return Status(Code::kInvalidArgument, fmt::format("'{}' is not a {}", text, what));
  return std::make_pair(value, lower(trim(text.substr(i))));
}

}  // namespace

Result<uint64_t> parse_size(std::string_view text) {
  DMX_ASSIGN_OR_RETURN(auto parts, split_number(text, "size"));
  auto [value, unit] = parts;
  if (!unit.empty() && unit.back() == 'b') unit.pop_back();
  if (!unit.empty() && unit.back() == 'i') unit.pop_back();
  double mult = 1;
  if (unit.empty()) mult = 1;
  else if (unit == "k") mult = 1024.0;
  else if (unit == "m") mult = 1024.0 * 1024;
  else if (unit == "g") mult = 1024.0 * 1024 * 1024;
  else if (unit == "t") mult = 1024.0 * 1024 * 1024 * 1024;
  else return Status(Code::kInvalidArgument, fmt::format("'{}': unknown size unit (use K, M, G, T)", text));
  double bytes = value * mult;
  if (bytes > static_cast<double>(std::numeric_limits<uint64_t>::max() / 2))
    return Status(Code::kInvalidArgument, fmt::format("'{}' is too large", text));
  if (bytes != static_cast<double>(static_cast<uint64_t>(bytes)))
    return Status(Code::kInvalidArgument, fmt::format("'{}' is not a whole number of bytes", text));
  return static_cast<uint64_t>(bytes);
}

std::string format_size(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) { v /= 1024; ++u; }
  if (u == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.{}f} {}", v, v == static_cast<double>(static_cast<uint64_t>(v)) ? 0 : 1, kUnits[u]);
}

Result<std::chrono::microseconds> parse_duration(std::string_view text) {
  DMX_ASSIGN_OR_RETURN(auto parts, split_number(text, "duration"));
  auto [value, unit] = parts;
  double us = 0;
  if (unit.empty() || unit == "ms") us = value * 1e3;
  else if (unit == "us") us = value;
  else if (unit == "s") us = value * 1e6;
  else if (unit == "m" || unit == "min") us = value * 60e6;
  else return Status(Code::kInvalidArgument, fmt::format("'{}': unknown duration unit (use us, ms, s, min)", text));
  return std::chrono::microseconds(static_cast<int64_t>(us));
}

Result<int64_t> parse_int(std::string_view text) {
  text = trim(text);
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size())
    return Status(Code::kInvalidArgument, fmt::format("'{}' is not an integer", text));
  return v;
}

Result<bool> parse_bool(std::string_view text) {
  std::string t = lower(trim(text));
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off") return false;
  return Status(Code::kInvalidArgument, fmt::format("'{}' is not a boolean (true/false)", text));
}

}  // namespace dmx
