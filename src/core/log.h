// Logging: one spdlog logger named "dmx", level from the log_level setting (DMX_LOG_LEVEL).
// Log once, where an error is first understood; callers propagate the Status without logging again.
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace dmx {

spdlog::logger& logger();
void set_log_level(std::string_view level);  // trace|debug|info|warn|error|off

}  // namespace dmx

#define DMX_LOG_TRACE(...) SPDLOG_LOGGER_TRACE(&::dmx::logger(), __VA_ARGS__)
#define DMX_LOG_DEBUG(...) ::dmx::logger().debug(__VA_ARGS__)
#define DMX_LOG_INFO(...) ::dmx::logger().info(__VA_ARGS__)
#define DMX_LOG_WARN(...) ::dmx::logger().warn(__VA_ARGS__)
#define DMX_LOG_ERROR(...) ::dmx::logger().error(__VA_ARGS__)
