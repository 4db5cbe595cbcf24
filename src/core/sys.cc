#include "core/sys.h"

#include <fmt/format.h>
#include <sched.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

namespace dmx {

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer.
  const char* msg = strerror_r(err, buf, sizeof buf);
  return fmt::format("{} (errno {})", msg, err);
}

Status errno_status(std::string_view call, int err, Code code) {
  return Status(code, fmt::format("{} failed: {}", call, errno_text(err)));
}

Status random_bytes(void* out, size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  while (n > 0) {
    ssize_t got = ::getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno_status("getrandom", errno);
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return Status();
}

uint64_t random_u64() {
  uint64_t v = 0;
  Status s = random_bytes(&v, sizeof v);
  assert(s.ok());
  (void)s;
  return v;
}

namespace {

std::string read_small_file(const std::string& path, size_t max = 64 << 10) {
  std::ifstream in(path);
  std::string text;
  char buf[4096];
  while (in && text.size() < max) {
    in.read(buf, sizeof buf);
    text.append(buf, static_cast<size_t>(in.gcount()));
  }
  return text;
}

bool parse_u64(std::string_view s, uint64_t* v) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && end == s.data() + s.size();
}

// "150000 100000" gives 1,500,000 millionths of a CPU; "max 100000", or anything else, 0.
uint64_t cpu_max_micros(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  size_t sp = text.find(' ');
  uint64_t quota = 0, period = 0;
  if (sp == std::string_view::npos || !parse_u64(text.substr(0, sp), &quota) ||
      !parse_u64(text.substr(sp + 1), &period) || period == 0 || quota == 0 || quota > UINT64_MAX / 1'000'000)
    return 0;
  return std::max<uint64_t>(quota * 1'000'000 / period, 1);
}

// The CPUs of this thread's affinity mask, in a set sized for hosts of more than 1,024 CPUs.
unsigned affinity_cpus(unsigned host) {
  for (size_t n = std::max(host, 1024u);; n *= 2) {
    cpu_set_t* set = CPU_ALLOC(n);
    if (set == nullptr) return 0;
    size_t bytes = CPU_ALLOC_SIZE(n);
    int rc = ::sched_getaffinity(0, bytes, set);
    int count = rc == 0 ? CPU_COUNT_S(bytes, set) : 0;
    CPU_FREE(set);
    if (rc == 0) return static_cast<unsigned>(count);
    if (errno != EINVAL || n >= (1u << 20)) return 0;
  }
}

}  // namespace

std::pair<std::string, std::string> cgroup2_mount(std::string_view mountinfo) {
  // "41 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw": root 4th, mount point 5th.
  std::istringstream lines{std::string(mountinfo)};
  for (std::string line; std::getline(lines, line);) {
    size_t dash = line.find(" - ");
    if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
    std::istringstream fields(line.substr(0, dash));
    std::string id, parent, dev, root, point;
    if (fields >> id >> parent >> dev >> root >> point) return {point, root};
  }
  return {};
}

uint64_t cgroup_quota_micros(const std::string& dir, std::string_view root, std::string_view self, std::string* at) {
  std::string path;  // "0::/a/b": the unified hierarchy's line
  std::istringstream lines{std::string(self)};
  for (std::string line; std::getline(lines, line);)
    if (line.starts_with("0::")) path = line.substr(3);
  if (dir.empty() || path.empty() || path[0] != '/') return 0;
  if (root != "/" && !root.empty()) {
    // Outside the mount's root (another namespace's view): only the mount's own cgroup is seen.
    if (path.starts_with(root) && (path.size() == root.size() || path[root.size()] == '/'))
      path = path.substr(root.size());
    else
      path.clear();
  }
  uint64_t lowest = 0;
  for (;;) {
    while (!path.empty() && path.back() == '/') path.pop_back();
    uint64_t q = cpu_max_micros(read_small_file(dir + path + "/cpu.max"));
    if (q != 0 && (lowest == 0 || q < lowest)) {
      lowest = q;
      if (at != nullptr) *at = path.empty() ? "/" : path;
    }
    if (path.empty()) return lowest;
    path.resize(path.rfind('/'));
  }
}

unsigned usable_cpus(std::string* why) {
  const unsigned host = std::max(std::thread::hardware_concurrency(), 1u);
  const unsigned affinity = affinity_cpus(host);
  unsigned cpus = affinity != 0 ? affinity : host;
  auto [dir, root] = cgroup2_mount(read_small_file("/proc/self/mountinfo", 1 << 20));
  std::string at;
  uint64_t quota = cgroup_quota_micros(dir, root, read_small_file("/proc/self/cgroup"), &at);
  if (quota != 0) cpus = std::min<uint64_t>(cpus, std::max<uint64_t>((quota + 999'999) / 1'000'000, 1));
  if (why != nullptr)
    *why =
        fmt::format("{} (affinity {} of {}; {})", cpus, affinity != 0 ? fmt::format("{}", affinity) : "unknown", host,
                    quota != 0 ? fmt::format("cgroup cpu.max {:.2f} CPUs at {}", quota / 1e6, at)
                               : std::string("no cgroup v2 CPU quota"));
  return cpus;
}

}  // namespace dmx
