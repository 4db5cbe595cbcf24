// Keeps the lines dmx logs at the logger's level (warnings unless DMX_LOG_LEVEL says more) while it
// lives, to check what each side said. Any number may live at once, made and dropped while dmx
// threads log: they subscribe to one sink of the test binary's, added to the logger during static
// initialization (spdlog's sink list itself is not safe to change while another thread logs).
#pragma once

#include <spdlog/sinks/base_sink.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/log.h"

namespace dmx::test {

namespace log_lines {

struct Lines {
  mutable std::mutex mu;  // guards lines (a test reads them while dmx threads log)
  std::vector<std::string> lines;
};

// The one sink: hands each line to the LogLines alive.
class Hub : public spdlog::sinks::base_sink<std::mutex> {
 public:
  void add(Lines* l) {
    std::lock_guard<std::mutex> lock(mutex_);
    subscribers_.push_back(l);
  }
  void remove(Lines* l) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase(subscribers_, l);
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& m) override {  // under mutex_
    for (Lines* l : subscribers_) {
      std::lock_guard<std::mutex> lock(l->mu);
      if (l->lines.size() < 10000) l->lines.emplace_back(m.payload.data(), m.payload.size());
    }
  }
  void flush_() override {}

 private:
  std::vector<Lines*> subscribers_;
};

inline Hub& hub() {
  static std::shared_ptr<Hub> h = [] {
    auto made = std::make_shared<Hub>();
    logger().sinks().push_back(made);
    return made;
  }();
  return *h;
}
inline const bool kHubAdded = (hub(), true);  // static initialization: before any dmx thread

}  // namespace log_lines

class LogLines {
 public:
  LogLines() { log_lines::hub().add(&lines_); }
  ~LogLines() { log_lines::hub().remove(&lines_); }
  LogLines(const LogLines&) = delete;
  LogLines& operator=(const LogLines&) = delete;
  // The lines that contain `what`.
  std::vector<std::string> with(const std::string& what) const {
    std::lock_guard<std::mutex> lock(lines_.mu);
    std::vector<std::string> out;
    for (const auto& l : lines_.lines)
      if (l.find(what) != std::string::npos) out.push_back(l);
    return out;
  }

 private:
  log_lines::Lines lines_;
};

}  // namespace dmx::test
