// Helpers of the rdma tests that run over a verbs device (rdma_path_test.cc, rdma_raw_peer_test.cc).
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <vector>

#include "test_env.h"
#include "transport/path.h"

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

}  // namespace dmx::rdma
