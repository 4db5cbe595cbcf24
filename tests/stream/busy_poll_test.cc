// When a stream busy-polls after progress and when it parks at once (StreamConfig::busy_poll,
// kBulkBurst). The test thread turns the stream itself and reads the other end of its socket.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <vector>

#include "stream/conduit.h"
#include "stream/stream.h"

namespace dmx::stream {
namespace {

// Hands the stream one host-memory chunk of `len` bytes, then nothing.
class OneChunkHost : public StreamHost {
 public:
  explicit OneChunkHost(size_t len) : data_(len, 0x5a) {}
  Result<RxPlan> on_header(int, const wire::FrameHeader&) override { return RxPlan{.kind = RxPlan::Kind::kDiscard}; }
  Status on_landed(int, const wire::FrameHeader&, RxPlan&) override { return Status(); }
  bool next_chunk(int, TxItem* out) override {
    if (given_) return false;
    given_ = true;
    out->header.type = wire::FrameType::kSendData;
    out->header.a1 = data_.size();
    out->src = data_.data();
    out->len = data_.size();
    out->ctx = std::make_shared<int>(0);  // on_sent is called for frames with a handle
    return true;
  }
  void on_sent(int, TxItem&) override { ++sent; }
  void on_stream_failed(int, const Status& s) override { ADD_FAILURE() << s.to_string(); }
  void on_stream_stopped(int) override {}
  Clock::time_point on_tick() override { return Clock::time_point::max(); }

  int sent = 0;

 private:
  std::vector<char> data_;
  bool given_ = false;
};

// Sends one chunk of `len` bytes on a data stream whose busy-poll window outlasts the test, and
// returns the passes after it until the stream parks (kMaxPasses: it kept polling).
constexpr int kMaxPasses = 50;
int passes_until_park(size_t len) {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
  UniqueFd peer(fds[1]);
  StreamConfig config;
  config.index = 1;
  config.busy_poll = std::chrono::seconds(30);
  config.keepalive = std::chrono::seconds(60);
  config.peer_timeout = std::chrono::seconds(60);
  OneChunkHost host(len);
  Stream s(config, std::make_unique<SocketConduit>(UniqueFd(fds[0])), &host, nullptr);
  std::vector<char> sink(1 << 20);
  auto drain = [&] {
    while (::read(peer.get(), sink.data(), sink.size()) > 0) {
    }
  };
  for (int i = 0; i < 10000 && host.sent == 0; ++i) {
    EXPECT_NE(s.turn(), Stream::Turn::kDone);
    drain();
  }
  EXPECT_EQ(host.sent, 1);
  int passes = 0;
  while (passes < kMaxPasses && s.turn() == Stream::Turn::kAgain) ++passes;
  s.stop();
  return passes;
}

TEST(StreamBusyPoll, SmallFramesKeepPolling) {
  EXPECT_EQ(passes_until_park(8), kMaxPasses);
  EXPECT_EQ(passes_until_park(kBulkBurst / 2), kMaxPasses);
}

// One pass to say it may sleep (sleeping_), one more to find nothing queued meanwhile: then it
// parks, inside the busy-poll window.
TEST(StreamBusyPoll, BulkDataParksAtOnce) {
  EXPECT_LE(passes_until_park(kBulkBurst), 2);
  EXPECT_LE(passes_until_park(256 << 10), 2);
}

}  // namespace
}  // namespace dmx::stream
