// dmx bench output: the text header and rows, the JSON rows, and the progress line.
// Called from the client's thread only (Progress has a thread of its own, see there).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "tools/dmx/bench.h"

namespace dmx::bench {

void print_header(const ClientOptions& co, const EndpointStats& st);
void print_row(const Result1& r, bool json, const ClientOptions& co, const EndpointStats& st);

// "[3/9] 256 MiB: latency, 4 s" on stderr, rewritten with \r once a size has run for a second,
// so that long sizes show life. Off unless stdout and stderr are terminals. The line is cleared
// by end(), before the size's row is printed.
class Progress {
 public:
  explicit Progress(bool on);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void begin(size_t index, size_t count, uint64_t size);
  void end();
  std::atomic<const char*> phase{""};  // ClientOptions::phase points here

 private:
  void loop();
  bool on_;
  std::mutex mu_;  // guards the fields below and the line on stderr
  std::condition_variable cv_;
  bool stop_ = false, active_ = false, shown_ = false;
  size_t index_ = 0, count_ = 0;
  uint64_t size_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::thread thread_;
};

}  // namespace dmx::bench
