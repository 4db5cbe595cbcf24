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

// A quota and its period in microseconds as millionths of a CPU; 0 for none (v1's -1, v2's max) or
// anything that is not a pair of numbers.
uint64_t quota_micros(std::string_view quota_text, std::string_view period_text) {
  uint64_t quota = 0, period = 0;
  if (!parse_u64(quota_text, &quota) || !parse_u64(period_text, &period) || period == 0 || quota == 0 ||
      quota > UINT64_MAX / 1'000'000)
    return 0;
  return std::max<uint64_t>(quota * 1'000'000 / period, 1);
}

std::string_view trimmed(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  return text;
}

// The quota one cgroup directory sets: v2's cpu.max ("150000 100000"), v1's cpu.cfs_quota_us and
// cpu.cfs_period_us.
uint64_t dir_quota_micros(const std::string& dir, bool v1) {
  if (v1)
    return quota_micros(trimmed(read_small_file(dir + "/cpu.cfs_quota_us")),
                        trimmed(read_small_file(dir + "/cpu.cfs_period_us")));
  std::string text = read_small_file(dir + "/cpu.max");
  std::string_view t = trimmed(text);
  size_t sp = t.find(' ');
  return sp == std::string_view::npos ? 0 : quota_micros(t.substr(0, sp), t.substr(sp + 1));
}

bool has_word(std::string_view list, std::string_view word) {  // "rw,cpu,cpuacct" has "cpu"
  for (size_t at = 0; at <= list.size();) {
    size_t end = std::min(list.find(',', at), list.size());
    if (list.substr(at, end - at) == word) return true;
    at = end + 1;
  }
  return false;
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

CgroupMount cpu_cgroup_mount(std::string_view mountinfo) {
  // "41 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw": root 4th, mount point 5th;
  // after " - ", the type, the source and the options ("rw,cpu,cpuacct" for a v1 hierarchy).
  CgroupMount v2;
  std::istringstream lines{std::string(mountinfo)};
  for (std::string line; std::getline(lines, line);) {
    size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream fields(line.substr(0, dash)), after(line.substr(dash + 3));
    std::string id, parent, dev, root, point, type, source, options;
    if (!(fields >> id >> parent >> dev >> root >> point) || !(after >> type >> source >> options)) continue;
    if (type == "cgroup" && has_word(options, "cpu")) return {point, root, true};
    if (type == "cgroup2" && v2.dir.empty()) v2 = {point, root, false};
  }
  return v2;
}

uint64_t cgroup_quota_micros(const CgroupMount& m, std::string_view self, std::string* at) {
  // "0::/a/b" names the v2 cgroup; "4:cpu,cpuacct:/a/b" the v1 cgroup of the cpu controller.
  std::string path;
  std::istringstream lines{std::string(self)};
  for (std::string line; std::getline(lines, line);) {
    size_t c1 = line.find(':'), c2 = c1 == std::string::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string::npos) continue;
    std::string_view controllers = std::string_view(line).substr(c1 + 1, c2 - c1 - 1);
    if (m.v1 ? has_word(controllers, "cpu") : line.starts_with("0::")) path = line.substr(c2 + 1);
  }
  if (m.dir.empty() || path.empty() || path[0] != '/') return 0;
  if (m.root != "/" && !m.root.empty()) {
    // Outside the mount's root (another namespace's view): only the mount's own cgroup is seen.
    if (path.starts_with(m.root) && (path.size() == m.root.size() || path[m.root.size()] == '/'))
      path = path.substr(m.root.size());
    else
      path.clear();
  }
  uint64_t lowest = 0;
  for (;;) {
    while (!path.empty() && path.back() == '/') path.pop_back();
    uint64_t q = dir_quota_micros(m.dir + path, m.v1);
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
  const CgroupMount mount = cpu_cgroup_mount(read_small_file("/proc/self/mountinfo", 1 << 20));
  std::string at;
  uint64_t quota = cgroup_quota_micros(mount, read_small_file("/proc/self/cgroup"), &at);
  if (quota != 0) cpus = std::min<uint64_t>(cpus, std::max<uint64_t>((quota + 999'999) / 1'000'000, 1));
  if (why != nullptr)
    *why = fmt::format(
        "{} (affinity {} of {}; {})", cpus, affinity != 0 ? fmt::format("{}", affinity) : "unknown", host,
        quota != 0
            ? fmt::format("cgroup {} {:.2f} CPUs at {}", mount.v1 ? "v1 cpu.cfs_quota_us" : "cpu.max", quota / 1e6, at)
            : std::string("no cgroup CPU quota"));
  return cpus;
}

}  // namespace dmx
