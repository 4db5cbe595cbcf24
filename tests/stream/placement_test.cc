// Where Workers::add puts streams: a data stream on the worker running the fewest data streams, a
// control stream on the one running the fewest streams. Two endpoints of a control stream and two
// data streams each on four workers is the loopback bench in small (2 × 9 streams on 16 workers):
// dealt round-robin, two data streams shared a worker while another worker ran none.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "stream/conduit.h"
#include "stream/stream.h"
#include "stream/workers.h"

namespace dmx::stream {
namespace {

using namespace std::chrono_literals;

// Streams with nothing to send: they park until stopped. Any worker calls it.
class IdleHost : public StreamHost {
 public:
  Result<RxPlan> on_header(int, const wire::FrameHeader&) override {
    RxPlan plan;
    plan.kind = RxPlan::Kind::kDiscard;
    return plan;
  }
  Status on_landed(int, const wire::FrameHeader&, RxPlan&) override { return Status(); }
  bool next_chunk(int, TxItem*) override { return false; }
  void on_sent(int, TxItem&) override {}
  void on_stream_failed(int, const Status&) override {}
  void on_stream_stopped(int) override {}
  Clock::time_point on_tick() override { return Clock::time_point::max(); }
};

class Rig {
 public:
  explicit Rig(int workers) : workers_(workers, "dmx-pt") {}
  ~Rig() { stop_all(); }

  // One stream over a socketpair whose far end stays open.
  void add(int index, bool bulk) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) != 0) throw std::runtime_error("socketpair");
    peers_.emplace_back(fds[1]);
    StreamConfig config;
    config.index = index;
    config.keepalive = 60s;
    config.peer_timeout = 60s;
    streams_.push_back(std::make_unique<Stream>(config, std::make_unique<SocketConduit>(UniqueFd(fds[0])), &host_,
                                                nullptr));
    workers_.add(streams_.back().get(), bulk, nullptr, [this] {
      std::lock_guard<std::mutex> lock(mu_);
      ++exited_;
      cv_.notify_all();
    });
  }
  // Stops every stream and waits until each has left its worker.
  void stop_all() {
    for (auto& s : streams_) s->stop();
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, 10s, [&] { return exited_ == streams_.size(); }))
        << exited_ << " of " << streams_.size() << " streams left their workers";
  }
  Workers& workers() { return workers_; }

 private:
  Workers workers_;  // declared first: it outlives the streams it runs
  IdleHost host_;
  std::vector<UniqueFd> peers_;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t exited_ = 0;
};

TEST(StreamPlacement, EachDataStreamGetsAWorkerOfItsOwn) {
  Rig rig(4);
  for (int endpoint = 0; endpoint < 2; ++endpoint) {
    rig.add(0, false);  // the control stream
    rig.add(1, true);
    rig.add(2, true);
  }
  std::vector<Workers::Load> loads = rig.workers().loads();
  ASSERT_EQ(loads.size(), 4u);
  for (size_t i = 0; i < loads.size(); ++i) {
    EXPECT_EQ(loads[i].bulk, 1u) << "worker " << i;
    EXPECT_LE(loads[i].streams, 2u) << "worker " << i;
  }
  rig.stop_all();
  for (const auto& l : rig.workers().loads()) {  // ended streams no longer count
    EXPECT_EQ(l.streams, 0u);
    EXPECT_EQ(l.bulk, 0u);
  }
}

// Streams alternating between data and control on two workers: each worker gets one of each.
// Dealt round-robin, one worker ran both data streams and the other both control streams.
TEST(StreamPlacement, ControlStreamsGoWhereFewestStreamsRun) {
  Rig rig(2);
  rig.add(1, true);
  rig.add(0, false);
  rig.add(2, true);
  rig.add(0, false);
  for (const auto& l : rig.workers().loads()) {
    EXPECT_EQ(l.bulk, 1u);
    EXPECT_EQ(l.streams, 2u);
  }
}

// More data streams than workers: they spread evenly, and control streams still go where there
// are fewest streams of any kind (round-robin spreads these too: this checks the counts add up).
TEST(StreamPlacement, DataStreamsSpreadEvenlyPastOnePerWorker) {
  Rig rig(3);
  for (int i = 0; i < 7; ++i) rig.add(1 + i, true);
  rig.add(0, false);
  rig.add(0, false);
  std::vector<Workers::Load> loads = rig.workers().loads();
  uint32_t most = 0, least = UINT32_MAX, streams = 0;
  for (const auto& l : loads) {
    most = std::max(most, l.bulk);
    least = std::min(least, l.bulk);
    streams += l.streams;
  }
  EXPECT_EQ(most - least, 1u);
  EXPECT_EQ(streams, 9u);
  for (const auto& l : loads) EXPECT_EQ(l.streams, 3u) << "the control streams went to the two lighter workers";
}

}  // namespace
}  // namespace dmx::stream
