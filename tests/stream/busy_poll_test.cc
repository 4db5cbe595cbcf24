// When a stream busy-polls after progress and when it parks at once (StreamConfig::busy_poll,
// kBulkBurst). The test thread turns the stream itself, as a worker would, and drains the other
// end of its socket after every pass. The busy-poll window (30 s) outlasts the test, so a stream
// that parks does so by the rule, never by the clock.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <deque>
#include <stdexcept>
#include <memory>
#include <vector>

#include "stream/conduit.h"
#include "stream/stream.h"

namespace dmx::stream {
namespace {

// Hands the stream the data chunks given to it, one at a time, from host memory.
class ChunkHost : public StreamHost {
 public:
  void give(size_t len) { lens_.push_back(len); }
  Result<RxPlan> on_header(int, const wire::FrameHeader&) override {
    RxPlan plan;
    plan.kind = RxPlan::Kind::kDiscard;
    return plan;
  }
  Status on_landed(int, const wire::FrameHeader&, RxPlan&) override { return Status(); }
  bool next_chunk(int, TxItem* out) override {
    if (lens_.empty()) return false;
    out->len = lens_.front();
    lens_.pop_front();
    data_.resize(std::max(data_.size(), out->len), 0x5a);
    out->header.type = wire::FrameType::kSendData;
    out->header.a1 = out->len;
    out->src = data_.data();
    out->ctx = std::make_shared<int>(0);  // on_sent is called for frames with a handle
    return true;
  }
  void on_sent(int, TxItem&) override { ++sent; }
  void on_stream_failed(int, const Status& s) override { ADD_FAILURE() << s.to_string(); }
  void on_stream_stopped(int) override {}
  Clock::time_point on_tick() override { return Clock::time_point::max(); }

  int sent = 0;

 private:
  std::deque<size_t> lens_;
  std::vector<char> data_;
};

constexpr int kMaxPasses = 50;

// A data stream (index 1) over a socketpair; `sndbuf` > 0 makes every pass write only a piece.
class Rig {
 public:
  explicit Rig(int sndbuf = 0) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) != 0) throw std::runtime_error("socketpair");
    peer_ = UniqueFd(fds[1]);
    if (sndbuf > 0) ::setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    StreamConfig config;
    config.index = 1;
    config.busy_poll = std::chrono::seconds(30);
    config.keepalive = std::chrono::seconds(60);
    config.peer_timeout = std::chrono::seconds(60);
    stream_ = std::make_unique<Stream>(config, std::make_unique<SocketConduit>(UniqueFd(fds[0])), &host, nullptr);
  }
  ~Rig() {
    stream_->stop();
    EXPECT_EQ(stream_->turn(), Stream::Turn::kDone);
    stream_->finish();
  }

  // Turns until every chunk given so far is out, draining the peer after each pass; returns the
  // passes that wrote them.
  int send(int chunks) {
    int passes = 0;
    for (; passes < 100000 && host.sent < chunks; ++passes) {
      EXPECT_NE(stream_->turn(), Stream::Turn::kDone);
      while (::read(peer_.get(), sink_.data(), sink_.size()) > 0) {
      }
    }
    EXPECT_EQ(host.sent, chunks);
    return passes;
  }
  // Passes until the stream parks (kMaxPasses: it kept polling), as its worker then sleeps.
  int passes_until_park() {
    int passes = 0;
    Stream::Turn t = Stream::Turn::kAgain;
    while (passes < kMaxPasses && (t = stream_->turn()) == Stream::Turn::kAgain) ++passes;
    if (t == Stream::Turn::kSleep) stream_->woke();
    EXPECT_NE(t, Stream::Turn::kDone);
    return passes;
  }
  Stream& stream() { return *stream_; }

  ChunkHost host;

 private:
  UniqueFd peer_;
  std::vector<char> sink_ = std::vector<char>(1 << 20);
  std::unique_ptr<Stream> stream_;
};

// Its first pass with nothing to do sets the sleeping flag (Stream::turn); the next parks.
constexpr int kParkAtOnce = 1;

TEST(StreamBusyPoll, SmallChunksKeepPolling) {
  for (size_t len : {size_t{8}, size_t{kBulkBurst / 2}}) {
    Rig rig;
    rig.host.give(len);
    rig.send(1);
    EXPECT_EQ(rig.passes_until_park(), kMaxPasses) << len;
  }
}

TEST(StreamBusyPoll, BulkChunksParkAtOnce) {
  for (size_t len : {size_t{kBulkBurst}, size_t{256} << 10}) {
    Rig rig;
    rig.host.give(len);
    rig.send(1);
    EXPECT_EQ(rig.passes_until_park(), kParkAtOnce) << len;
  }
}

// Two small chunks in one burst add up to bulk, also when each pass ends with the socket full.
TEST(StreamBusyPoll, ABurstIsJudgedWhole) {
  for (int sndbuf : {0, 4096}) {
    Rig rig(sndbuf);
    rig.host.give(kBulkBurst / 2);
    rig.host.give(kBulkBurst / 2);
    rig.send(2);
    EXPECT_EQ(rig.passes_until_park(), kParkAtOnce) << sndbuf;
  }
}

// A chunk written a few KiB per pass, the socket full at the end of each: the burst is the chunk,
// not the last piece.
TEST(StreamBusyPoll, AChunkWrittenInPiecesIsOneBurst) {
  Rig rig(4096);
  rig.host.give(256 << 10);
  EXPECT_GT(rig.send(1), 2);  // really in pieces
  EXPECT_EQ(rig.passes_until_park(), kParkAtOnce);
}

// After bulk data, the next small message gets the spin back.
TEST(StreamBusyPoll, SmallAfterBulkPollsAgain) {
  Rig rig;
  rig.host.give(256 << 10);
  rig.send(1);
  EXPECT_EQ(rig.passes_until_park(), kParkAtOnce);
  rig.host.give(8);
  rig.send(2);
  EXPECT_EQ(rig.passes_until_park(), kMaxPasses);
}

// Eager messages and control frames are small messages however many go at once: 64 KiB of EAGER
// frames in one burst keep the spin.
TEST(StreamBusyPoll, EagerFramesNeverCountAsBulk) {
  Rig rig;
  for (int i = 0; i < 4; ++i) {
    TxItem item;
    item.header.type = wire::FrameType::kEager;
    item.owned.assign(16 << 10, 0x33);
    item.src = item.owned.data();
    item.len = item.owned.size();
    rig.stream().push_control(std::move(item));
  }
  rig.send(0);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(rig.stream().turn(), Stream::Turn::kAgain);  // writes them, then polls
  }
  EXPECT_EQ(rig.stream().stats().frames_sent, 4u);
  EXPECT_EQ(rig.passes_until_park(), kMaxPasses);
}

}  // namespace
}  // namespace dmx::stream
