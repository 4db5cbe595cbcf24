// Keeps the lines dmx logs at the logger's level (warnings unless DMX_LOG_LEVEL says more) while it
// lives, to check what each side said. Create it before any dmx thread starts: spdlog's sink list
// is not safe to change while another thread logs.
#pragma once

#include <spdlog/sinks/base_sink.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/log.h"

namespace dmx::test {

class LogLines {
 public:
  LogLines() : sink_(std::make_shared<Sink>()) { logger().sinks().push_back(sink_); }
  ~LogLines() { std::erase(logger().sinks(), sink_); }
  // The lines that contain `what`.
  std::vector<std::string> with(const std::string& what) const {
    std::lock_guard<std::mutex> lock(sink_->mu);
    std::vector<std::string> out;
    for (const auto& l : sink_->lines)
      if (l.find(what) != std::string::npos) out.push_back(l);
    return out;
  }

 private:
  struct Sink : spdlog::sinks::base_sink<std::mutex> {
    mutable std::mutex mu;  // guards lines (with() reads them while dmx threads log)
    std::vector<std::string> lines;
    void sink_it_(const spdlog::details::log_msg& m) override {
      std::lock_guard<std::mutex> lock(mu);
      if (lines.size() < 10000) lines.emplace_back(m.payload.data(), m.payload.size());
    }
    void flush_() override {}
  };
  std::shared_ptr<Sink> sink_;
};

}  // namespace dmx::test
