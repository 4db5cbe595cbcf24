#include "plugins/nccl/log.h"

#include <atomic>
#include <cstdio>

namespace dmx::nccl {

namespace {
std::atomic<Logger> g_logger{nullptr};
std::atomic<int> g_warnings{0};
std::atomic<int> g_infos{0};
}  // namespace

void set_logger(Logger log) {
  if (log != nullptr) g_logger.store(log);
}

void log_line(LogLevel level, unsigned long subsys, const std::string& text) {
  const bool is_warn = level == kLogWarn;
  std::atomic<int>& count = is_warn ? g_warnings : g_infos;
  const int limit = is_warn ? kMaxWarnings : kMaxInfos;
  int n = count.fetch_add(1, std::memory_order_relaxed);
  if (n > limit) return;
  std::string line = n == limit ? fmt::format("NET/dmx: more than {} {} lines; the rest are dropped", limit,
                                              is_warn ? "warning" : "info")
                                : "NET/dmx: " + text;
  Logger log = g_logger.load();
  if (log != nullptr) {
    log(level, subsys, "plugins/nccl", 0, "%s", line.c_str());
  } else if (is_warn) {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

}  // namespace dmx::nccl
