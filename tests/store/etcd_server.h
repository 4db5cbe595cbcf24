// A private etcd server for tests (Debian's etcd-server): loopback ports, a data folder of its
// own, stopped (SIGTERM, then SIGKILL) by the destructor. Tests skip with the reason when
// /usr/bin/etcd is absent.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "store/store.h"

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

  // Starts it (keeping the data folder of an earlier start) and waits until it answers.
  bool start() {
    std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
    std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    pid_ = ::fork();
    if (pid_ == 0) {
      std::string log = dir_.string() + ".log";
      FILE* f = std::freopen(log.c_str(), "a", stderr);
      (void)f;
      std::string data = dir_.string();
      std::string cluster = "default=" + peer;
      ::execl(kBinary, kBinary, "--data-dir", data.c_str(), "--listen-client-urls", client.c_str(),
              "--advertise-client-urls", client.c_str(), "--listen-peer-urls", peer.c_str(),
              "--initial-advertise-peer-urls", peer.c_str(), "--initial-cluster", cluster.c_str(), "--log-level",
              "error", "--logger", "zap", (char*)nullptr);
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
