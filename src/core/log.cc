#include "core/log.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "dmx/log.h"

namespace dmx {
namespace {

LogLevel to_log_level(spdlog::level::level_enum l) {
  switch (l) {
    case spdlog::level::trace: return LogLevel::kTrace;
    case spdlog::level::debug: return LogLevel::kDebug;
    case spdlog::level::info: return LogLevel::kInfo;
    case spdlog::level::warn: return LogLevel::kWarn;
    case spdlog::level::err: return LogLevel::kError;
    default: return LogLevel::kCritical;
  }
}

// The logger's one sink: the handler of set_log_handler when there is one, else stderr.
class DispatchSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  void set_handler(LogHandler handler) {
    LogHandler old;
    std::lock_guard<std::mutex> lock(mutex_);
    old.swap(handler_);
    handler_ = std::move(handler);
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (handler_) handler_(to_log_level(msg.level), std::string_view(msg.payload.data(), msg.payload.size()));
    else stderr_.log(msg);
  }
  void flush_() override { stderr_.flush(); }
  void set_pattern_(const std::string& pattern) override { stderr_.set_pattern(pattern); }
  void set_formatter_(std::unique_ptr<spdlog::formatter> f) override { stderr_.set_formatter(std::move(f)); }

 private:
  spdlog::sinks::stderr_color_sink_st stderr_;  // guarded by mutex_, as handler_
  LogHandler handler_;
};

const std::shared_ptr<DispatchSink>& dispatch_sink() {
  static const auto sink = std::make_shared<DispatchSink>();
  return sink;
}

}  // namespace

spdlog::logger& logger() {
  // Built on first use; logs go to stderr so that `--json` output on stdout stays clean. Not in
  // spdlog's registry: another copy of dmx in the process (a plugin) has a logger of its own.
  static std::shared_ptr<spdlog::logger> log = [] {
    auto l = std::make_shared<spdlog::logger>("dmx", dispatch_sink());
    l->set_pattern("[%H:%M:%S.%e] [dmx] [%^%l%$] %v");
    // A library is quiet unless asked: warnings and errors (the log_level setting's default).
    const char* env = std::getenv("DMX_LOG_LEVEL");
    l->set_level(env ? spdlog::level::from_str(env) : spdlog::level::warn);
    return l;
  }();
  return *log;
}

void set_log_level(std::string_view level) {
  logger().set_level(spdlog::level::from_str(std::string(level)));
}

void set_log_handler(LogHandler handler) { dispatch_sink()->set_handler(std::move(handler)); }

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
