// Helpers of the rdma tests that run over a verbs device (rdma_path_test.cc, rdma_raw_peer_test.cc):
// their fixture's base, a recorder of a path's events, two queue-pair connections joined.
#pragma once

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/config.h"
#include "test_env.h"
#include "transport/path.h"
#include "transport/rdma/device.h"
#include "transport/rdma/setup.h"

namespace dmx::rdma {

constexpr unsigned char kPoison = 0xA5;

inline std::vector<unsigned char> fresh(size_t n) {
  static std::mt19937_64 rng(std::random_device{}());
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

// Records a path's events; wait() is bounded.
struct Recorder : PayloadPath::Events {
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, Status> tx, rx;
  std::optional<Status> failure;
  bool stopped = false;
  void on_path_tx_done(uint64_t seq, const Status& s) override {
    note([&] { tx[seq] = s; });
  }
  void on_path_rx_done(uint64_t seq, const Status& s) override {
    note([&] { rx[seq] = s; });
  }
  void on_path_failed(const Status& s) override {
    note([&] { failure = s; });
  }
  void on_path_stopped() override {
    note([&] { stopped = true; });
  }
  template <class F>
  void note(F f) {
    std::lock_guard l(mu);
    f();
    cv.notify_all();
  }
  template <class P>
  bool wait(P pred, std::chrono::seconds limit = test::kEventually) {
    std::unique_lock l(mu);
    return cv.wait_for(l, limit, [&] { return pred(*this); });
  }
};

// A payload path under test and what it reported.
struct Side {
  std::unique_ptr<PayloadPath> path;
  Recorder events;
};

// Two queue-pair connections joined over a socket pair (the data socket's stand-in), set up at
// once as two hosts would: `a` on a_fd, which knows its peer as a_peer, `b` likewise.
struct ConnectedPair {
  Result<std::unique_ptr<Connection>> a = Status(Code::kInternal, "not run");
  Result<std::unique_ptr<Connection>> b = Status(Code::kInternal, "not run");
  int a_fd = -1, b_fd = -1;
};
inline ConnectedPair connect_pair(const std::shared_ptr<Device>& dev, Depths a, const std::string& a_peer, Depths b,
                                  const std::string& b_peer, std::chrono::seconds limit,
                                  void (*a_hostile)(ConnInfo*) = nullptr) {
  ConnectedPair p;
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) {
    p.a = Status(Code::kInternal, "socketpair failed");
    p.b = Status(Code::kInternal, "socketpair failed");
    return p;
  }
  p.a_fd = fds[0];
  p.b_fd = fds[1];
  std::thread t([&] { p.a = connect_qps(dev, fds[0], a, a_peer, Deadline::after(limit), a_hostile); });
  p.b = connect_qps(dev, fds[1], b, b_peer, Deadline::after(limit));
  t.join();
  return p;
}

// A test over the verbs device: skipped with the reason where there is none (failed in
// scripts/rxe-vm.sh's guest, which sets DMX_RXE_GUEST and must have one).
class RdmaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = Config::resolve();
    ASSERT_TRUE(config.ok());
    auto d = open_device(*config);
    if (!d.ok() && std::getenv("DMX_RXE_GUEST")) FAIL() << "DMX_RXE_GUEST is set, but " << d.status().message();
    if (!d.ok()) DMX_SKIP(test::kNoRdma) << d.status().message();
    dev_ = *d;
  }
  // Stops the sides' paths, each waited for (bounded).
  static void stop(std::initializer_list<Side*> sides) {
    for (Side* s : sides)
      if (s->path) {
        s->path->stop();
        s->events.wait([](Recorder& r) { return r.stopped; });
      }
  }

  std::shared_ptr<Device> dev_;
};

}  // namespace dmx::rdma
