// usable_cpus: the affinity mask and the cgroup v2 CPU quota, through their seams on a made-up
// cgroup tree, the real mask narrowed on a thread, and a real quota where the test may set one
// (the soft-RoCE guest of scripts/rxe-check.sh, which must).
#include "core/sys.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "temp_dir.h"
#include "test_env.h"

namespace dmx {
namespace {

namespace fs = std::filesystem;

using test::TempDir;

TEST(UsableCpus, FindsTheMountOfTheCpuController) {
  const std::string v1 = "30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
  const std::string others =
      "25 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
      "31 25 0:27 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n"
      "32 25 0:28 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct\n";
  const std::string v2 = "41 25 0:38 /kubepods/pod1 /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";
  CgroupMount m = cpu_cgroup_mount(others + v2);
  EXPECT_EQ(m.dir, "/sys/fs/cgroup");
  EXPECT_EQ(m.root, "/kubepods/pod1");
  EXPECT_FALSE(m.v1);
  // A v1 hierarchy with the cpu controller holds it, whatever v2 has (hybrid hosts).
  m = cpu_cgroup_mount(others + v2 + v1);
  EXPECT_EQ(m.dir, "/sys/fs/cgroup/cpu,cpuacct");
  EXPECT_EQ(m.root, "/");
  EXPECT_TRUE(m.v1);
  EXPECT_TRUE(cpu_cgroup_mount(others).dir.empty());
  EXPECT_TRUE(cpu_cgroup_mount("").dir.empty());
  EXPECT_TRUE(cpu_cgroup_mount("garbage - cgroup2\n41 25 - \n").dir.empty());
}

TEST(UsableCpus, TakesTheLowestQuotaOnTheWayUp) {
  TempDir d;
  const CgroupMount m{d.path(), "/", false};
  test::write_file(d.path() + "/a/cpu.max", "max 100000\n");
  test::write_file(d.path() + "/a/b/cpu.max", "350000 100000\n");
  test::write_file(d.path() + "/a/b/c/cpu.max", "max 100000\n");
  std::string at;
  EXPECT_EQ(cgroup_quota_micros(m, "0::/a/b/c\n", &at), 3'500'000u);
  EXPECT_EQ(at, "/a/b");
  // A parent's lower quota binds its children.
  test::write_file(d.path() + "/a/cpu.max", "50000 100000\n");
  EXPECT_EQ(cgroup_quota_micros(m, "0::/a/b/c\n", &at), 500'000u);
  EXPECT_EQ(at, "/a");
  // The v1 controllers' lines are not the unified hierarchy's.
  EXPECT_EQ(cgroup_quota_micros(m, "4:cpu:/a/b\n1:name=systemd:/\n", &at), 0u);
  EXPECT_EQ(cgroup_quota_micros(m, "4:cpu:/x\n0::/a/b/c\n", &at), 500'000u);
  // No quota anywhere; no mount.
  EXPECT_EQ(cgroup_quota_micros(m, "0::/elsewhere\n", &at), 0u);
  EXPECT_EQ(cgroup_quota_micros(CgroupMount{}, "0::/a/b/c\n", &at), 0u);
}

TEST(UsableCpus, ReadsAV1Hierarchy) {
  TempDir d;
  const CgroupMount m{d.path(), "/", true};
  test::write_file(d.path() + "/a/cpu.cfs_quota_us", "150000\n");
  test::write_file(d.path() + "/a/cpu.cfs_period_us", "100000\n");
  test::write_file(d.path() + "/a/b/cpu.cfs_quota_us", "-1\n");  // none
  test::write_file(d.path() + "/a/b/cpu.cfs_period_us", "100000\n");
  std::string at;
  // The cpu controller's line, not cpuset's or the unified hierarchy's.
  const char* self = "5:cpuset:/elsewhere\n4:cpu,cpuacct:/a/b\n0::/other\n";
  EXPECT_EQ(cgroup_quota_micros(m, self, &at), 1'500'000u);
  EXPECT_EQ(at, "/a");
  EXPECT_EQ(cgroup_quota_micros(m, "5:cpuset:/a/b\n4:cpuacct:/a/b\n", &at), 0u);
  test::write_file(d.path() + "/a/cpu.cfs_period_us", "0\n");
  EXPECT_EQ(cgroup_quota_micros(m, self, &at), 0u);
}

TEST(UsableCpus, ReadsAMountOfAnotherCgroupRoot) {
  TempDir d;  // a container: its cgroup is the mount's root, its own cpu.max at the top
  test::write_file(d.path() + "/cpu.max", "200000 100000\n");
  test::write_file(d.path() + "/sub/cpu.max", "max 100000\n");
  std::string at;
  EXPECT_EQ(cgroup_quota_micros({d.path(), "/pod1", false}, "0::/pod1/sub\n", &at), 2'000'000u);
  EXPECT_EQ(at, "/");
  EXPECT_EQ(cgroup_quota_micros({d.path(), "/", false}, "0::/\n", &at), 2'000'000u);
  // A cgroup outside the mount's root (shown as another namespace sees it): the mount's own.
  EXPECT_EQ(cgroup_quota_micros({d.path(), "/pod1", false}, "0::/pod10/sub\n", &at), 2'000'000u);
}

TEST(UsableCpus, IgnoresWhatIsNotAQuota) {
  TempDir d;
  const CgroupMount m{d.path(), "/", false};
  std::string at;
  for (const char* text : {"", "max", "max 100000", "100000 0", "0 100000", "-5 100000", "abc 100000",
                           "100000 100000 7", "18446744073709551615 100000", "1e5 100000"}) {
    test::write_file(d.path() + "/a/cpu.max", text);
    EXPECT_EQ(cgroup_quota_micros(m, "0::/a\n", &at), 0u) << "'" << text << "'";
  }
  test::write_file(d.path() + "/a/cpu.max", "1 1000000");  // a millionth of a CPU still counts as one
  EXPECT_EQ(cgroup_quota_micros(m, "0::/a\n", &at), 1u);
}

TEST(UsableCpus, FollowTheAffinityMask) {
  std::string why;
  const unsigned all = usable_cpus(&why);
  EXPECT_GE(all, 1u);
  EXPECT_LE(all, std::max(std::thread::hardware_concurrency(), 1u));
  EXPECT_NE(why.find("affinity"), std::string::npos) << why;
  // Narrowed to one CPU, on a thread of its own so that the test's other threads keep theirs.
  unsigned narrowed = 0;
  int rc = -1;
  std::thread([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(static_cast<unsigned>(sched_getcpu()), &one);
    rc = sched_setaffinity(0, sizeof one, &one);
    narrowed = usable_cpus(&why);
  }).join();
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(narrowed, 1u);
  EXPECT_NE(why.find("affinity 1 of"), std::string::npos) << why;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Writes `text` to a cgroup file; "" when it took it, else why not (the kernel's errno).
std::string put(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY);
  if (fd < 0) return path + ": open: " + std::strerror(errno);
  ssize_t n = ::write(fd, text.data(), text.size());
  std::string e =
      n == static_cast<ssize_t>(text.size()) ? "" : path + ": write '" + text + "': " + std::strerror(errno);
  ::close(fd);
  return e;
}

// Where the cpu controller is on a v1 hierarchy (this CI machine), or on v2 with the right to
// enable it (the soft-RoCE guest, which mounts no cgroup2 itself: the test does), the test process
// joins a cgroup under a parent allowed half a CPU, then goes back.
TEST(UsableCpus, ObeyARealCgroupQuota) {
  const bool guest = std::getenv("DMX_RXE_GUEST") != nullptr;
  const auto refuse = [&](const std::string& why) {
    if (guest) FAIL() << why;
    DMX_SKIP(test::kNoCapability) << "no cgroup CPU quota can be set here: " << why;
  };
  CgroupMount m = cpu_cgroup_mount(slurp("/proc/self/mountinfo"));
  struct Mounted {
    std::string at;
    ~Mounted() {
      if (!at.empty()) ::umount2(at.c_str(), MNT_DETACH), ::rmdir(at.c_str());
    }
  } mounted;
  if (m.dir.empty()) {
    if (!guest) return refuse("no cgroup mount holds the cpu controller");
    char tmpl[] = "/tmp/dmx-cg-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    ASSERT_EQ(::mount("none", tmpl, "cgroup2", 0, nullptr), 0) << std::strerror(errno);
    mounted.at = m.dir = tmpl;
    m.root = "/";
  }
  std::string path;
  for (std::istringstream lines(slurp("/proc/self/cgroup")); std::getline(lines, path);) {
    size_t c1 = path.find(':'), c2 = c1 == std::string::npos ? c1 : path.find(':', c1 + 1);
    if (c2 == std::string::npos) continue;
    const std::string controllers = "," + path.substr(c1 + 1, c2 - c1 - 1) + ",";
    if (m.v1 ? controllers.find(",cpu,") != std::string::npos : path.starts_with("0::")) {
      path = path.substr(c2 + 1);
      break;
    }
  }
  if (!path.starts_with("/") || m.root != "/") return refuse("this process's cgroup is not under the mount's root");
  if (path == "/") path.clear();
  const std::string base = m.dir + path, q = base + "/dmx-quota-" + std::to_string(::getpid()), r = q + "/r";
  // v2 hands the controller down explicitly; v1 has it everywhere.
  if (!m.v1)
    if (std::string e = put(base + "/cgroup.subtree_control", "+cpu"); !e.empty()) return refuse(e);
  std::error_code ec;
  if (!std::filesystem::create_directories(r, ec)) return refuse(r + ": " + ec.message());
  struct Removed {
    std::string q, r, back;
    ~Removed() {
      put(back + "/cgroup.procs", std::to_string(::getpid()));  // a cgroup with a process stays
      ::rmdir(r.c_str());
      ::rmdir(q.c_str());
    }
  } removed{q, r, base};
  // Half a CPU on the parent, none on the child the process joins: the lowest on the way up binds.
  std::vector<std::pair<std::string, std::string>> steps;
  if (m.v1)
    steps = {{q + "/cpu.cfs_period_us", "100000"}, {q + "/cpu.cfs_quota_us", "50000"}, {r + "/cpu.cfs_quota_us", "-1"}};
  else
    steps = {{q + "/cgroup.subtree_control", "+cpu"}, {q + "/cpu.max", "50000 100000"}, {r + "/cpu.max", "max 100000"}};
  steps.emplace_back(r + "/cgroup.procs", std::to_string(::getpid()));
  for (const auto& [file, text] : steps)
    if (std::string e = put(file, text); !e.empty()) return refuse(e);
  std::string why;
  const unsigned cpus = usable_cpus(&why);
  EXPECT_EQ(cpus, 1u) << why;
  const std::string said = m.v1 ? "cgroup v1 cpu.cfs_quota_us 0.50 CPUs at " : "cgroup cpu.max 0.50 CPUs at ";
  EXPECT_NE(why.find(said + path + "/dmx-quota-"), std::string::npos) << why;
}

}  // namespace
}  // namespace dmx
