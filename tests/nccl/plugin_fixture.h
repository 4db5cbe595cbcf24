// The fixture of the NCCL plugin's tests (plugin_test.cc: both ends in this process;
// plugin_process_test.cc: against a peer process): the plugin loaded through one exported
// version (the test's parameter), and the peer process nccl_peer.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dmx/dmx.h"
#include "nccl/nccl_test_paths.h"
#include "test_env.h"
#include "tests/nccl/harness.h"

extern char** environ;

namespace dmx::nccl::test {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

inline const bool kEnvSet = (set_test_env(), true);

inline double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

inline uint64_t fresh_seed() { return std::random_device{}() * 0x100000001ull + std::random_device{}(); }

inline bool logged(const std::string& what) {
  for (const auto& l : logged_lines())
    if (l.find(what) != std::string::npos) return true;
  return false;
}

// The peer process, with a pipe to its stdin and one from its stdout.
class Peer {
 public:
  ~Peer() { kill(); }
  // `mem`: "" (host), "cuda" (cudaMalloc on cuda:0) or "cumem:GPU" (nccl_peer.cc); `env`:
  // NAME=VALUE entries that replace or add to this process's environment.
  void start(int version, const std::string& role, uint64_t seed, const std::string& mem = "",
             const std::vector<std::string>& env = {}) {
    int in[2], out[2];
    ASSERT_EQ(::pipe2(in, O_CLOEXEC), 0);
    ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    std::string v = std::to_string(version), s = std::to_string(seed);
    std::vector<char*> argv = {const_cast<char*>(DMX_NCCL_PEER_PATH), const_cast<char*>(DMX_NCCL_PLUGIN_PATH),
                               v.data(), const_cast<char*>(role.c_str()), s.data()};
    if (!mem.empty()) argv.push_back(const_cast<char*>(mem.c_str()));
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (char** e = environ; *e != nullptr; ++e) {
      bool replaced = false;
      for (const auto& x : env) replaced |= std::strncmp(*e, x.c_str(), x.find('=') + 1) == 0;
      if (!replaced) envp.push_back(*e);
    }
    for (const auto& x : env) envp.push_back(const_cast<char*>(x.c_str()));
    envp.push_back(nullptr);
    ASSERT_EQ(::posix_spawn(&pid_, DMX_NCCL_PEER_PATH, &fa, nullptr, argv.data(), envp.data()), 0);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1];
    from_ = ::fdopen(out[0], "r");
  }
  // The next line the peer prints (without the newline); "" at its end.
  std::string line() {
    char buf[1024];
    if (from_ == nullptr || std::fgets(buf, sizeof buf, from_) == nullptr) return {};
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  void say(const std::string& s) {
    std::string l = s + "\n";
    ASSERT_EQ(::write(to_, l.data(), l.size()), static_cast<ssize_t>(l.size()));
  }
  void kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    if (to_ >= 0) ::close(to_), to_ = -1;
    if (from_ != nullptr) std::fclose(from_), from_ = nullptr;
  }
  int wait_exit() {
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1;
  FILE* from_ = nullptr;
};

inline std::string hex(const unsigned char* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += d[p[i] >> 4], s += d[p[i] & 15];
  return s;
}
inline void unhex(const std::string& s, unsigned char* out, size_t n) {
  ASSERT_EQ(s.size(), 2 * n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<unsigned char>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
}

class Nccl : public ::testing::TestWithParam<int> {
 protected:
  // A comm with the peer process: we listen and it connects (we_receive), or the other way round.
  void open_comm(Peer& peer, bool we_receive, void** comm) {
    unsigned char h[kHandleMaxSize] = {};
    if (we_receive) {
      void* lc = nullptr;
      ASSERT_EQ(api_.listen(0, h, &lc), kSuccess);
      peer.say("HANDLE " + hex(h, sizeof h));
      ASSERT_EQ(accept_until(api_, lc, comm), kSuccess);
      ASSERT_EQ(api_.close_listen(lc), kSuccess);
    } else {
      std::string l = peer.line();
      ASSERT_EQ(l.rfind("HANDLE ", 0), 0u) << l;
      unhex(l.substr(7), h, sizeof h);
      ASSERT_EQ(connect_until(api_, 0, h, comm), kSuccess);
    }
  }
  void SetUp() override {
    std::string e = api_.load(DMX_NCCL_PLUGIN_PATH, GetParam());
    ASSERT_TRUE(e.empty()) << e;
    ASSERT_EQ(api_.init(), kSuccess);
  }
  void TearDown() override { EXPECT_EQ(api_.finalize(), kSuccess); }

  // Both ends in this process: listen, then connect and accept polled in turn.
  void pair(void** sc, void** rc, void** lc_out = nullptr) {
    unsigned char h[kHandleMaxSize] = {};
    void* lc = nullptr;
    ASSERT_EQ(api_.listen(0, h, &lc), kSuccess);
    ASSERT_NE(lc, nullptr);
    *sc = *rc = nullptr;
    auto t0 = Clock::now();
    while ((*sc == nullptr || *rc == nullptr) && since(t0) < 20) {
      if (*sc == nullptr) {
        ASSERT_EQ(api_.connect(0, h, sc), kSuccess);
      }
      if (*rc == nullptr) {
        ASSERT_EQ(api_.accept(lc, rc), kSuccess);
      }
      std::this_thread::sleep_for(200us);
    }
    ASSERT_NE(*sc, nullptr);
    ASSERT_NE(*rc, nullptr);
    if (lc_out) *lc_out = lc;
    else ASSERT_EQ(api_.close_listen(lc), kSuccess);
  }

  // Tests `req` until done or `seconds`; returns test()'s result (kSystemError + 100 on time-out).
  int wait(void* req, int* sizes = nullptr, double seconds = 10) {
    auto t0 = Clock::now();
    for (;;) {
      int done = 0;
      NcclResult r = api_.test(req, &done, sizes);
      if (r != kSuccess || done) return r;
      if (since(t0) > seconds) return 100 + kSystemError;
      std::this_thread::sleep_for(100us);
    }
  }

  Api api_;
};

inline std::string version_name(const ::testing::TestParamInfo<int>& i) { return "v" + std::to_string(i.param); }

}  // namespace dmx::nccl::test
