// Logging: one spdlog logger named "dmx", level from the log_level setting (DMX_LOG_LEVEL).
// Log once, where an error is first understood; callers propagate the Status without logging again.
//
// A peer must not be able to fill a disk through us: text from a peer goes through printable(),
// and every line a peer can cause again and again goes through a LogLimiter.
#pragma once

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace dmx {

spdlog::logger& logger();
void set_log_level(std::string_view level);  // trace|debug|info|warn|error|off

// Text that came from a peer, safe to print: bytes outside printable ASCII (control characters
// included) become \xNN, a backslash \\, and at most `max` input bytes are kept (the rest counted).
std::string printable(std::string_view text, size_t max = 200);

// Lets one line of each kind through per interval; counts the others, and the next line of that
// kind that passes says how many were held back. Kinds are short literals ("unknown key"); at
// most kMaxKinds are told apart, the rest share one. Thread-safe.
class LogLimiter {
 public:
  static constexpr size_t kMaxKinds = 64;
  explicit LogLimiter(std::chrono::milliseconds interval = std::chrono::seconds(1)) : interval_(interval) {}

  // -1: suppress this line; otherwise log it, and that many lines of the kind were suppressed.
  int64_t admit(std::string_view kind);

  template <typename... Args>
  void log(spdlog::level::level_enum level, std::string_view kind, fmt::format_string<Args...> f, Args&&... args) {
    if (!logger().should_log(level)) return;
    int64_t held = admit(kind);
    if (held < 0) return;
    std::string line = fmt::format(f, std::forward<Args>(args)...);
    if (held > 0) line += fmt::format(" ({} more like this in the last {} ms not shown)", held, interval_.count());
    logger().log(level, "{}", line);
  }

 private:
  struct Slot {
    std::string kind;
    std::chrono::steady_clock::time_point last;
    int64_t held = 0;
  };
  const std::chrono::milliseconds interval_;
  std::mutex mu_;  // guards slots_
  std::vector<Slot> slots_;
};

}  // namespace dmx

#define DMX_LOG_TRACE(...) SPDLOG_LOGGER_TRACE(&::dmx::logger(), __VA_ARGS__)
#define DMX_LOG_DEBUG(...) ::dmx::logger().debug(__VA_ARGS__)
#define DMX_LOG_INFO(...) ::dmx::logger().info(__VA_ARGS__)
#define DMX_LOG_WARN(...) ::dmx::logger().warn(__VA_ARGS__)
#define DMX_LOG_ERROR(...) ::dmx::logger().error(__VA_ARGS__)
// A line a peer can cause repeatedly: at most one per kind and interval of `limiter`.
#define DMX_LOG_LIMITED(limiter, lvl, kind, ...) (limiter).log(::spdlog::level::lvl, kind, __VA_ARGS__)
