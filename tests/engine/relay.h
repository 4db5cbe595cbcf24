// A TCP relay on 127.0.0.1 for tests: every connection made to it is carried to a target port, both
// ways, and the bytes the connecting side sent before its first answer (its first frame: HELLO, JOIN
// or REJOIN) are kept, so a test can replay them. Stops and joins its threads when destroyed.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/sys.h"

namespace dmx::test {

class Relay {
 public:
  explicit Relay(uint16_t target) : target_(target) {
    listen_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a = loopback(0);
    socklen_t len = sizeof a;
    if (::bind(listen_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_.get(), 64) != 0 ||
        ::getsockname(listen_.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return;
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~Relay() {
    stop_ = true;
    if (acceptor_.joinable()) acceptor_.join();  // no pump starts after this
    {
      std::lock_guard<std::mutex> g(mu_);
      for (auto& c : conns_) {
        ::shutdown(c.a.get(), SHUT_RDWR);
        ::shutdown(c.b.get(), SHUT_RDWR);
      }
    }
    for (auto& t : pumps_) t.join();
  }
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  uint16_t port() const { return port_; }  // 0: it could not listen
  std::string address() const { return "tcp://127.0.0.1:" + std::to_string(port_); }
  // What each connection's client sent before its first answer, in the order they came.
  std::vector<std::vector<unsigned char>> first_bytes() {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<std::vector<unsigned char>> out;
    for (auto& c : conns_) out.push_back(c.first);
    return out;
  }

 private:
  struct Conn {
    UniqueFd a, b;  // the client's side, the target's
    std::vector<unsigned char> first;
    bool answered = false;
  };

  static sockaddr_in loopback(uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
  }

  void accept_loop() {
    while (!stop_) {
      pollfd p{listen_.get(), POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      UniqueFd a(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!a.valid()) continue;
      UniqueFd b(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      sockaddr_in t = loopback(target_);
      if (::connect(b.get(), reinterpret_cast<sockaddr*>(&t), sizeof t) != 0) continue;  // a closes
      size_t k;
      {
        std::lock_guard<std::mutex> g(mu_);
        conns_.push_back(Conn{std::move(a), std::move(b), {}, false});
        k = conns_.size() - 1;
      }
      pumps_.emplace_back([this, k] { pump(k); });
    }
  }

  // Both directions of connection k until either side ends; then both end.
  void pump(size_t k) {
    int a, b;
    {
      std::lock_guard<std::mutex> g(mu_);
      a = conns_[k].a.get();
      b = conns_[k].b.get();
    }
    std::vector<unsigned char> buf(1 << 16);
    while (!stop_) {
      pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
      if (::poll(p, 2, 50) <= 0) continue;
      bool ended = false;
      for (int i = 0; i < 2 && !ended; ++i) {
        if (p[i].revents == 0) continue;
        ssize_t n = ::recv(p[i].fd, buf.data(), buf.size(), 0);
        if (n <= 0) {
          ended = true;
          break;
        }
        {
          std::lock_guard<std::mutex> g(mu_);
          Conn& c = conns_[k];
          if (i == 1) c.answered = true;
          else if (!c.answered) c.first.insert(c.first.end(), buf.begin(), buf.begin() + n);
        }
        int to = i == 0 ? b : a;
        for (ssize_t off = 0; off < n && !ended;) {
          ssize_t m = ::send(to, buf.data() + off, static_cast<size_t>(n - off), MSG_NOSIGNAL);
          if (m <= 0) ended = true;
          else off += m;
        }
      }
      if (ended) break;
    }
    ::shutdown(a, SHUT_RDWR);
    ::shutdown(b, SHUT_RDWR);
  }

  uint16_t target_, port_ = 0;
  UniqueFd listen_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<Conn> conns_;            // mu_; the fds stay open until the relay goes
  std::thread acceptor_;
  std::vector<std::thread> pumps_;  // the acceptor's, then the destructor's once it joined the acceptor
};

}  // namespace dmx::test
