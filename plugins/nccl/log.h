// log.h — the plugin's lines go to NCCL's logger (the function NCCL passes to init), bounded.
//
// NCCL prints them under NCCL_DEBUG=INFO / WARN with its own prefix. At most kMaxWarnings warnings
// and kMaxInfos info lines are written per process, then one line says the rest were dropped, so a
// peer that keeps failing cannot flood NCCL's log. Thread-safe. Before init (or with a null
// logger) warnings go to stderr, info lines nowhere.
#pragma once

#include <fmt/format.h>

#include <string>

#include "plugins/nccl/nccl_abi.h"

namespace dmx::nccl {

inline constexpr int kMaxWarnings = 200;
inline constexpr int kMaxInfos = 1000;

void set_logger(Logger log);
void log_line(LogLevel level, unsigned long subsys, const std::string& text);

template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  log_line(kLogWarn, kSubsysNet, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void info(unsigned long subsys, fmt::format_string<Args...> f, Args&&... args) {
  log_line(kLogInfo, subsys, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace dmx::nccl
