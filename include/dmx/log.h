// dmx/log.h — where dmx's log lines go.
//
// By default dmx writes its lines to stderr, warnings and errors only (the log_level setting,
// DMX_LOG_LEVEL, decides; it is process-wide, and each Context::create applies its own value). A
// program that has a logging system of its own hands the lines to it with set_log_handler.
#pragma once

#include <functional>
#include <string_view>

namespace dmx {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kCritical };

// Called for each line at or above the log level, instead of writing it to stderr, on the thread
// that logs (any dmx thread, one line at a time). `message` is the line's text without time or
// level, valid during the call. The handler must return quickly and must not call into dmx.
using LogHandler = std::function<void(LogLevel level, std::string_view message)>;

// Installs `handler` for the whole process; an empty one restores stderr. Thread-safe: a line
// being logged meanwhile goes to the old or the new destination. Once this returns, the old
// handler is no longer called.
void set_log_handler(LogHandler handler);

}  // namespace dmx
