// usable_cpus: the affinity mask and the cgroup v2 CPU quota, through their seams on a made-up
// cgroup tree, and the real mask narrowed on a thread.
#include "core/sys.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

namespace dmx {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/dmx-cgroup-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::trunc) << text;
}

TEST(UsableCpus, FindsTheCgroup2Mount) {
  const std::string info =
      "25 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
      "30 25 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
      "41 25 0:38 /kubepods/pod1 /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";
  EXPECT_EQ(cgroup2_mount(info), std::make_pair(std::string("/sys/fs/cgroup"), std::string("/kubepods/pod1")));
  EXPECT_EQ(cgroup2_mount("30 25 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"),
            std::make_pair(std::string(), std::string()));
  EXPECT_EQ(cgroup2_mount(""), std::make_pair(std::string(), std::string()));
}

TEST(UsableCpus, TakesTheLowestQuotaOnTheWayUp) {
  TempDir d;
  write(d.path() + "/a/cpu.max", "max 100000\n");
  write(d.path() + "/a/b/cpu.max", "350000 100000\n");
  write(d.path() + "/a/b/c/cpu.max", "max 100000\n");
  std::string at;
  EXPECT_EQ(cgroup_quota_micros(d.path(), "/", "0::/a/b/c\n", &at), 3'500'000u);
  EXPECT_EQ(at, "/a/b");
  // A parent's lower quota binds its children.
  write(d.path() + "/a/cpu.max", "50000 100000\n");
  EXPECT_EQ(cgroup_quota_micros(d.path(), "/", "0::/a/b/c\n", &at), 500'000u);
  EXPECT_EQ(at, "/a");
  // The v1 controllers' lines are not the unified hierarchy's.
  EXPECT_EQ(cgroup_quota_micros(d.path(), "/", "4:cpu:/a/b\n1:name=systemd:/\n", &at), 0u);
  EXPECT_EQ(cgroup_quota_micros(d.path(), "/", "4:cpu:/x\n0::/a/b/c\n", &at), 500'000u);
  // No quota anywhere; no mount.
  EXPECT_EQ(cgroup_quota_micros(d.path(), "/", "0::/elsewhere\n", &at), 0u);
  EXPECT_EQ(cgroup_quota_micros("", "/", "0::/a/b/c\n", &at), 0u);
}

TEST(UsableCpus, ReadsAMountOfAnotherCgroupRoot) {
  TempDir d;  // a container: its cgroup is the mount's root, its own cpu.max at the top
  write(d.path() + "/cpu.max", "200000 100000\n");
  write(d.path() + "/sub/cpu.max", "max 100000\n");
  std::string at;
  EXPECT_EQ(cgroup_quota_micros(d.path(), "/pod1", "0::/pod1/sub\n", &at), 2'000'000u);
  EXPECT_EQ(at, "/");
  EXPECT_EQ(cgroup_quota_micros(d.path(), "/", "0::/\n", &at), 2'000'000u);
  // A cgroup outside the mount's root (shown as another namespace sees it): the mount's own.
  EXPECT_EQ(cgroup_quota_micros(d.path(), "/pod1", "0::/pod10/sub\n", &at), 2'000'000u);
}

TEST(UsableCpus, IgnoresWhatIsNotAQuota) {
  TempDir d;
  std::string at;
  for (const char* text : {"", "max", "max 100000", "100000 0", "0 100000", "-5 100000", "abc 100000",
                           "100000 100000 7", "18446744073709551615 100000", "1e5 100000"}) {
    write(d.path() + "/a/cpu.max", text);
    EXPECT_EQ(cgroup_quota_micros(d.path(), "/", "0::/a\n", &at), 0u) << "'" << text << "'";
  }
  write(d.path() + "/a/cpu.max", "1 1000000");  // a millionth of a CPU still counts as one
  EXPECT_EQ(cgroup_quota_micros(d.path(), "/", "0::/a\n", &at), 1u);
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

}  // namespace
}  // namespace dmx
