#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

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
