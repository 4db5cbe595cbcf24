#include "log.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string_view>
#include <utility>

#include "dmx/log.h"

namespace py = pybind11;

namespace dmxpy {
namespace {

constexpr size_t kMaxLines = 10000;
constexpr size_t kMaxLineBytes = 4096;

struct Line {
  int levelno;  // logging's numbers
  std::string message;
  double time;  // seconds since the epoch, as time.time()
};

int levelno(dmx::LogLevel level) {
  switch (level) {
    case dmx::LogLevel::kTrace: return 5;
    case dmx::LogLevel::kDebug: return 10;
    case dmx::LogLevel::kInfo: return 20;
    case dmx::LogLevel::kWarn: return 30;
    case dmx::LogLevel::kError: return 40;
    default: return 50;
  }
}

struct Queue {
  std::mutex mu;  // guards the rest
  std::condition_variable cv;
  std::deque<Line> lines;
  uint64_t dropped = 0;
  bool stopped = true;
};

// Never destroyed: dmx threads may still log while the process exits. Replaced only in a forked
// child, where no dmx thread runs.
std::atomic<Queue*> queue{new Queue()};

void push(dmx::LogLevel level, std::string_view message) {
  Queue* q = queue.load();
  double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::lock_guard<std::mutex> lock(q->mu);
  if (q->lines.size() >= kMaxLines) {
    ++q->dropped;
    return;
  }
  std::string text(message.substr(0, kMaxLineBytes));
  if (message.size() > kMaxLineBytes) text += "... (" + std::to_string(message.size() - kMaxLineBytes) + " more bytes)";
  q->lines.push_back(Line{levelno(level), std::move(text), now});
  if (q->lines.size() == 1) q->cv.notify_one();
}

}  // namespace

void log_start(bool after_fork) {
  // A forked child inherits the parent's queue, and possibly its mutex held by a thread that is
  // not there: it starts afresh (the old one is leaked, as it may be locked).
  if (after_fork) queue.store(new Queue());
  {
    std::lock_guard<std::mutex> lock(queue.load()->mu);
    queue.load()->stopped = false;
  }
  py::gil_scoped_release nogil;
  dmx::set_log_handler(push);
}

py::object log_take(double timeout) {
  std::deque<Line> lines;
  uint64_t dropped = 0;
  bool stopped;
  {
    py::gil_scoped_release nogil;
    Queue* q = queue.load();
    std::unique_lock<std::mutex> lock(q->mu);
    q->cv.wait_for(lock, std::chrono::duration<double>(timeout),
                       [q] { return !q->lines.empty() || q->dropped > 0 || q->stopped; });
    lines.swap(q->lines);
    std::swap(dropped, q->dropped);
    stopped = q->stopped;
  }
  if (stopped && lines.empty() && dropped == 0) return py::none();
  py::list out;
  for (const Line& l : lines) out.append(py::make_tuple(l.levelno, l.message, l.time));
  if (dropped > 0) {
    double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    out.append(py::make_tuple(30, std::to_string(dropped) + " dmx log lines dropped: Python took them too slowly", now));
  }
  return out;
}

void log_stop() {
  {
    py::gil_scoped_release nogil;
    dmx::set_log_handler({});
  }
  Queue* q = queue.load();
  std::lock_guard<std::mutex> lock(q->mu);
  q->stopped = true;
  q->cv.notify_all();
}

std::string python_log_level() {
  int level = py::module_::import("logging").attr("getLogger")("dmx").attr("getEffectiveLevel")().cast<int>();
  if (level <= 5) return "trace";
  if (level <= 10) return "debug";
  if (level <= 20) return "info";
  if (level <= 30) return "warn";
  if (level <= 40) return "error";
  return "off";  // dmx logs nothing above error
}

}  // namespace dmxpy
