// Small operating-system helpers: owned file descriptors, errno text, random bytes, usable CPUs.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "dmx/status.h"

namespace dmx {

// One step of a spin-wait: tells the core this is a busy loop (x86 pause, arm yield).
inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// "connect(10.0.0.2:7000) failed: Connection refused (errno 111)"
Status errno_status(std::string_view call, int err, Code code = Code::kIo);
std::string errno_text(int err);

// Cryptographically strong random bytes (getrandom).
Status random_bytes(void* out, size_t n);
uint64_t random_u64();

// The CPUs this process may run on: its affinity mask (taskset, a cpuset), capped by the CPU
// quota of its cgroup and every parent's (cgroup v2's cpu.max, or v1's cpu.cfs_quota_us where the
// cpu controller is on a v1 hierarchy; rounded up). Sizes thread counts and spinning, where
// std::thread::hardware_concurrency counts every CPU of the host. `why`, when given, gets how the
// number was found: "4 (affinity 16 of 128; cgroup cpu.max 3.50 CPUs at /x)".
unsigned usable_cpus(std::string* why = nullptr);

// The seams of usable_cpus, for tests.
struct CgroupMount {
  std::string dir;   // where it is mounted; empty: none
  std::string root;  // the cgroup path it shows as its root
  bool v1 = false;   // a cgroup v1 hierarchy with the cpu controller, else cgroup v2
};
// The mount that holds the cpu controller, from /proc/self/mountinfo's text: a v1 hierarchy with
// `cpu` among its options (the controller is then not v2's), else the v2 mount.
CgroupMount cpu_cgroup_mount(std::string_view mountinfo);
// The lowest CPU quota (in millionths of a CPU) on the way from this process's cgroup, named in
// /proc/self/cgroup's text `self`, up to the mount's root; 0 when none sets one. `at` gets the
// cgroup that sets it.
uint64_t cgroup_quota_micros(const CgroupMount& m, std::string_view self, std::string* at);

}  // namespace dmx
