// Running the built `dmx` binary from a test.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_env.h"

namespace dmx::test {

// DMX_BIN, else the dmx next to this build's test binary (<build>/tests/probe -> <build>/tools/dmx).
inline std::string dmx_bin() {
  if (const char* b = std::getenv("DMX_BIN"); b != nullptr && *b != '\0') return b;
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "";
  std::string path(self, static_cast<size_t>(n));
  size_t tests = path.rfind("/tests/probe/");
  return tests == std::string::npos ? "" : path.substr(0, tests) + "/tools/dmx/dmx";
}

// Runs a shell command, returns its stdout; *rc gets the exit status (-1 when it did not exit).
inline std::string run_command(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) {
    *rc = -1;
    return out;
  }
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = ::pclose(p);
  *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// The JSON objects among a command's output lines (`dmx bench --json` rows); a line that starts
// with '{' but does not parse comes back as a discarded value, for the caller to reject.
inline std::vector<nlohmann::json> json_rows(const std::string& out) {
  std::vector<nlohmann::json> rows;
  size_t start = 0;
  while (start < out.size()) {
    size_t end = out.find('\n', start);
    if (end == std::string::npos) end = out.size();
    std::string line = out.substr(start, end - start);
    start = end + 1;
    if (line.empty() || line[0] != '{') continue;
    rows.push_back(nlohmann::json::parse(line, nullptr, false));
  }
  return rows;
}

}  // namespace dmx::test

#define REQUIRE_DMX_BIN()                                                        \
  if (::dmx::test::dmx_bin().empty() || ::access(::dmx::test::dmx_bin().c_str(), X_OK) != 0) \
  DMX_SKIP(::dmx::test::kNotBuilt) << "the dmx binary " << ::dmx::test::dmx_bin()
