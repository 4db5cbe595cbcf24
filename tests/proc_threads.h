// Threads of this process, as /proc/self/task lists them (for tests of thread life cycles).
#pragma once

#include <dirent.h>

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

}  // namespace dmx
