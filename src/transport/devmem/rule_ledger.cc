#include "transport/devmem/rule_ledger.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/sys.h"

namespace dmx::devmem {
namespace {

struct Line {
  uint32_t location;
  long pid;
};

Result<std::vector<Line>> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<Line> out;
  if (!in) return out;  // no file: no rules
  std::string text;
  for (int n = 1; std::getline(in, text); ++n) {
    if (text.empty()) continue;
    std::istringstream ls(text);
    Line l{};
    if (!(ls >> l.location >> l.pid))
      return Status(Code::kInvalidArgument, fmt::format("{}:{}: expected '<location> <pid>', got '{}'", path, n, text));
    out.push_back(l);
  }
  return out;
}

// Runs `change` on the lines under an exclusive lock and writes the result back atomically.
template <typename F>
Status update(const std::string& path, F change) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  UniqueFd lock(::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock.valid()) return errno_status(fmt::format("open({}.lock)", path), errno);
  if (::flock(lock.get(), LOCK_EX) != 0) return errno_status(fmt::format("flock({}.lock)", path), errno);
  DMX_ASSIGN_OR_RETURN(auto lines, read_lines(path));
  change(lines);
  std::string tmp = fmt::format("{}.{}.tmp", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const auto& l : lines) out << l.location << ' ' << l.pid << '\n';
    out.flush();
    if (!out) return Status(Code::kIo, fmt::format("writing {}", tmp));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) return errno_status(fmt::format("rename({})", path), errno);
  return Status();
}

}  // namespace

std::string RuleLedger::path_for(const std::string& state_dir, const std::string& ifname) {
  return fmt::format("{}/devmem-{}.rules", state_dir, ifname);
}

Status RuleLedger::add(uint32_t location) {
  return update(path_, [&](std::vector<Line>& v) { v.push_back({location, static_cast<long>(::getpid())}); });
}

Status RuleLedger::remove(uint32_t location) {
  return update(path_, [&](std::vector<Line>& v) {
    auto it = std::find_if(v.begin(), v.end(), [&](const Line& l) { return l.location == location; });
    if (it != v.end()) v.erase(it);
  });
}

Status RuleLedger::forget(const std::vector<uint32_t>& locations) {
  return update(path_, [&](std::vector<Line>& v) {
    std::erase_if(v, [&](const Line& l) { return std::find(locations.begin(), locations.end(), l.location) != locations.end(); });
  });
}

Result<std::vector<uint32_t>> RuleLedger::list() const {
  DMX_ASSIGN_OR_RETURN(auto lines, read_lines(path_));
  std::vector<uint32_t> out;
  for (const auto& l : lines) out.push_back(l.location);
  return out;
}

}  // namespace dmx::devmem
