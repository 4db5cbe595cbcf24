// Threads of this process, as /proc/self/task lists them (for tests of thread life cycles).
#pragma once

#include <dirent.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

namespace dmx {

// All threads, or only those whose name (comm) starts with `prefix`; -1 when /proc cannot be read.
inline int process_threads(std::string_view prefix = {}) {
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    if (prefix.empty()) {
      ++n;
      continue;
    }
    std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string name;
    std::getline(comm, name);
    n += name.starts_with(prefix) ? 1 : 0;
  }
  ::closedir(d);
  return n;
}

// The threads whose name starts with `prefix`: how many, and their voluntary context switches
// summed (each one a sleep of the thread that ended: its wake-ups). threads is -1 when /proc cannot
// be read.
struct ThreadWakeups {
  int threads = 0;
  long wakeups = 0;
};
inline ThreadWakeups thread_wakeups(std::string_view prefix) {
  ThreadWakeups w;
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return ThreadWakeups{-1, 0};
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string dir = std::string("/proc/self/task/") + e->d_name;
    std::ifstream comm(dir + "/comm");
    std::string name;
    std::getline(comm, name);
    if (!name.starts_with(prefix)) continue;
    ++w.threads;
    std::ifstream status(dir + "/status");
    std::string line;
    while (std::getline(status, line))
      if (line.starts_with("voluntary_ctxt_switches:")) w.wakeups += std::atol(line.c_str() + 24);
  }
  ::closedir(d);
  return w;
}

}  // namespace dmx
