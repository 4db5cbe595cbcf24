// Helpers for the same-host transport tests: deterministic data, child processes, a completion pump.
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "transport/shm/shm.h"

namespace dmx::testing {

// Bytes that depend on (seed, index) only, so that both processes can produce and check them.
inline uint8_t pattern_byte(uint64_t seed, size_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + (i / 8) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<uint8_t>(x >> (8 * (i % 8)));
}
inline void fill_pattern(void* p, size_t n, uint64_t seed) {
  auto* b = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) b[i] = pattern_byte(seed, i);
}
// Index of the first byte that differs, or SIZE_MAX when all match.
inline size_t check_pattern(const void* p, size_t n, uint64_t seed) {
  auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i)
    if (b[i] != pattern_byte(seed, i)) return i;
  return SIZE_MAX;
}

// Threads of this process, from /proc/self/task.
inline int thread_count() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

// Runs fn in a forked child; the child exits with fn's return value (never returns into gtest).
// Under AddressSanitizer the parent must have no other thread yet: GCC 12's ASan allocator has no
// fork handler, so a child forked while another thread holds an allocator lock hangs at its first
// allocation (seen as a peer that sends nothing for peer_timeout). Fork before making contexts.
// Checked where one test runs per process (ctest); earlier tests of a whole-binary run leave
// pooled threads behind.
inline pid_t fork_child(const std::function<int()>& fn) {
#if defined(__SANITIZE_ADDRESS__)
  if (int n = thread_count(); n > 1 && ::testing::UnitTest::GetInstance()->test_to_run_count() == 1)
    ADD_FAILURE() << "fork_child with " << n << " threads: under ASan the child may hang; fork first";
#endif
  pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 99;
    rc = fn();
    ::_exit(rc);
  }
  return pid;
}

// Waits for the child's exit; -1 if it did not exit in time (it is then killed), 128+sig if killed.
inline int wait_child(pid_t pid, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int st = 0;
    pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (r < 0) return -2;
    if (std::chrono::steady_clock::now() > end) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Runs fn in a forked child (for code that must not initialise CUDA in this process) and returns
// the text it produced (at most 2 KiB); `exit_code`, when given, gets the child's exit status.
inline std::string text_from_child(const std::function<std::string()>& fn, int* exit_code = nullptr) {
  int fds[2];
  if (::pipe(fds) != 0) return "";
  pid_t child = fork_child([&] {
    ::close(fds[0]);
    std::string msg = fn();
    (void)!::write(fds[1], msg.data(), msg.size());
    return 0;
  });
  ::close(fds[1]);
  char buf[2048] = {};
  ssize_t got = ::read(fds[0], buf, sizeof buf - 1);
  ::close(fds[0]);
  int rc = wait_child(child);
  if (exit_code != nullptr) *exit_code = rc;
  return std::string(buf, got > 0 ? static_cast<size_t>(got) : 0);
}

// Drives a link and remembers every completion by (kind, id).
class Pump {
 public:
  explicit Pump(shm::ShmLink* link) : link_(link) {}
  // Progress until the completion (kind, id) arrived or the deadline passed (kTimeout).
  Result<shm::Completion> wait_for(shm::Completion::Kind kind, shm::MsgId id, Deadline deadline) {
    for (;;) {
      auto it = done_.find({kind, id});
      if (it != done_.end()) {
        shm::Completion c = std::move(it->second);
        done_.erase(it);
        return c;
      }
      std::vector<shm::Completion> out;
      link_->progress(&out);
      for (auto& c : out) done_[{c.kind, c.id}] = std::move(c);
      if (!out.empty()) continue;
      if (deadline.expired()) return Status(Code::kTimeout, "test pump: completion did not arrive");
      Status s = link_->wait(Deadline::after(std::chrono::milliseconds(50)).earlier(deadline));
      if (!s.ok() && s.code() != Code::kTimeout) return s;
    }
  }
  // Waits for a completion and returns its status.
  Status finish(shm::Completion::Kind kind, shm::MsgId id, Deadline deadline, size_t* bytes = nullptr) {
    auto c = wait_for(kind, id, deadline);
    if (!c.ok()) return c.status();
    if (bytes) *bytes = c->bytes;
    return c->status;
  }

 private:
  shm::ShmLink* link_;
  std::map<std::pair<int, shm::MsgId>, shm::Completion> done_;
};

inline Deadline secs(int s) { return Deadline::after(std::chrono::seconds(s)); }

}  // namespace dmx::testing
