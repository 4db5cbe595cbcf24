// A private etcd server for tests (Debian's etcd-server): loopback ports, a data folder of its
// own, stopped (SIGTERM, then SIGKILL) by the destructor. Tests skip with the reason when
// /usr/bin/etcd is absent.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "store/store.h"
#include "test_env.h"

namespace dmx::testing {

inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

class EtcdServer {
 public:
  static constexpr const char* kBinary = "/usr/bin/etcd";
  static bool available() { return ::access(kBinary, X_OK) == 0; }

  EtcdServer() : client_port_(free_port()), peer_port_(free_port()) {
    dir_ = std::filesystem::temp_directory_path() / ("dmx-etcd-" + std::to_string(::getpid()) + "-" +
                                                     std::to_string(client_port_));
  }
  ~EtcdServer() {
    stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string url() const { return "etcd://127.0.0.1:" + std::to_string(client_port_); }

  // Starts it (keeping the data folder of an earlier start) and waits until it answers. The child
  // dies with the thread that forked it (PR_SET_PDEATHSIG) and writes to a log file, never to the
  // test's stdout or stderr: a test process that dies without its destructor (an assertion, a
  // sanitizer's report) leaves no etcd behind holding ctest's output pipe open.
  bool start() {
    std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
    std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    std::string log = dir_.string() + ".log";
    std::string data = dir_.string();
    std::string cluster = "default=" + peer;
    const char* argv[] = {kBinary, "--data-dir", data.c_str(), "--listen-client-urls", client.c_str(),
                          "--advertise-client-urls", client.c_str(), "--listen-peer-urls", peer.c_str(),
                          "--initial-advertise-peer-urls", peer.c_str(), "--initial-cluster", cluster.c_str(),
                          "--log-level", "error", "--logger", "zap", nullptr};
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {  // async-signal-safe calls only: the test has threads
      if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(126);
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
      if (fd < 0 || ::dup2(fd, STDOUT_FILENO) < 0 || ::dup2(fd, STDERR_FILENO) < 0) ::_exit(126);
      ::execv(kBinary, const_cast<char* const*>(argv));
      ::_exit(127);
    }
    auto s = store::open_store(url(), std::chrono::milliseconds(1000));
    for (int i = 0; i < 300; ++i) {  // up to a minute on a busy machine
      if (s.ok() && (*s)->get("dmx-test/ping").ok()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return false;
  }

  void wipe() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  int client_port_, peer_port_;
  std::filesystem::path dir_;
  pid_t pid_ = -1;
};

}  // namespace dmx::testing

// A test of the etcd store: skips where the build has no etcd client (cpp-httplib) or the host no
// etcd, else starts one as `server`.
#define DMX_NEED_ETCD(server)                                                                                      \
  if (!DMX_TEST_HAVE_HTTPLIB) DMX_SKIP(::dmx::test::kNotBuilt) << "the etcd store (no cpp-httplib in this build)"; \
  if (!::dmx::testing::EtcdServer::available())                                                                    \
    DMX_SKIP(::dmx::test::kNotInstalled) << ::dmx::testing::EtcdServer::kBinary                                    \
                                         << " is absent (apt-get install etcd-server)";                            \
  ::dmx::testing::EtcdServer server;                                                                               \
  ASSERT_TRUE(server.start()) << "etcd did not start"
