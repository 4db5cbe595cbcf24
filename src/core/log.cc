#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <algorithm>
#include <cstdlib>

namespace dmx {

spdlog::logger& logger() {
  // Built on first use; logs go to stderr so that `--json` output on stdout stays clean.
  static std::shared_ptr<spdlog::logger> log = [] {
    auto l = spdlog::stderr_color_mt("dmx");
    l->set_pattern("[%H:%M:%S.%e] [dmx] [%^%l%$] %v");
    const char* env = std::getenv("DMX_LOG_LEVEL");
    l->set_level(env ? spdlog::level::from_str(env) : spdlog::level::info);
    return l;
  }();
  return *log;
}

void set_log_level(std::string_view level) {
  logger().set_level(spdlog::level::from_str(std::string(level)));
}

}  // namespace dmx

namespace dmx {

std::string printable(std::string_view text, size_t max) {
  std::string out;
  size_t n = std::min(text.size(), max);
  out.reserve(n + 16);
  for (size_t i = 0; i < n; ++i) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c == '\\') out += "\\\\";
    else if (c >= 0x20 && c < 0x7f) out += static_cast<char>(c);
    else out += fmt::format("\\x{:02x}", c);
  }
  if (text.size() > n) out += fmt::format("... ({} more bytes)", text.size() - n);
  return out;
}

int64_t LogLimiter::admit(std::string_view kind) {
  auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  Slot* slot = nullptr;
  for (auto& s : slots_)
    if (s.kind == kind) slot = &s;
  if (slot == nullptr) {
    if (slots_.size() < kMaxKinds) {
      slots_.push_back(Slot{std::string(kind), now, 0});
      return 0;
    }
    slot = &slots_.back();  // the shared slot for kinds beyond the cap
  }
  if (now - slot->last < interval_) {
    ++slot->held;
    return -1;
  }
  int64_t held = slot->held;
  slot->last = now;
  slot->held = 0;
  return held;
}

}  // namespace dmx
