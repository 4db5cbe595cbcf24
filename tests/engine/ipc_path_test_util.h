// Shared by the cuda_ipc payload path tests (ipc_path_test.cc, ipc_path_gpu_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>

#include "core/config.h"
#include "transport/cuda_ipc/ipc_path.h"

namespace dmx::testing {

// Records what a path reports; waits with deadlines.
class Recorder final : public PayloadPath::Events {
 public:
  void on_path_tx_done(uint64_t, const Status&) override {
    std::lock_guard lock(mu_);
    ++tx_done;
  }
  void on_path_rx_done(uint64_t seq, const Status& s) override {
    std::lock_guard lock(mu_);
    rx[seq] = s;
    ++rx_count[seq];
    ++rx_total;
    if (stopped != 0) ++rx_after_stop;
    if (on_rx) on_rx(seq);
    cv_.notify_all();
  }
  void on_path_failed(const Status& s) override {
    std::lock_guard lock(mu_);
    ++failed;
    failure = s;
    cv_.notify_all();
  }
  void on_path_stopped() override {
    std::lock_guard lock(mu_);
    ++stopped;
    cv_.notify_all();
  }
  bool wait_rx(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return rx_total >= n; });
  }
  bool wait_stopped(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return stopped > 0; });
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Status> rx;
  std::map<uint64_t, int> rx_count;
  size_t rx_total = 0, rx_after_stop = 0;
  int tx_done = 0, failed = 0, stopped = 0;
  Status failure;
  std::function<void(uint64_t)> on_rx;  // called under mu_ on the path's thread
};

inline Config config() {
  auto c = Config::resolve();
  EXPECT_TRUE(c.ok());
  return *c;
}

}  // namespace dmx::testing
