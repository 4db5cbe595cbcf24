// An authenticated peer that floods requests which each earn a reply, and never reads: the server
// stops reading from it once its replies back up (bounded memory), refused operations use up an
// error budget after which it is closed, log lines stay few, and other clients go on.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <thread>

#include "hostile/hostile_util.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;
using wire::FrameType;

// Sends frames without ever reading until `stop` says so, the socket is closed, or writing has
// been blocked for `stuck` (the server stopped reading). Returns how many frames went out.
template <typename MakeFrame>
uint64_t flood(RawPeer& peer, MakeFrame make, std::chrono::milliseconds stuck, uint64_t max_frames) {
  int fd = peer.fd();
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  std::vector<unsigned char> batch;
  uint64_t sent = 0;
  auto last_progress = Clock::now();
  size_t off = 0;
  while (sent < max_frames && Clock::now() - last_progress < stuck) {
    if (off == batch.size()) {
      batch.clear();
      off = 0;
      for (int i = 0; i < 256; ++i) {
        auto b = wire::encode_header(make(sent + static_cast<uint64_t>(i)));
        batch.insert(batch.end(), b.begin(), b.end());
      }
    }
    ssize_t k = ::send(fd, batch.data() + off, batch.size() - off, MSG_NOSIGNAL);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      std::this_thread::sleep_for(1ms);
      continue;
    }
    if (k <= 0) break;  // closed by the server
    size_t before = off / wire::kHeaderSize;
    off += static_cast<size_t>(k);
    sent += off / wire::kHeaderSize - before;
    last_progress = Clock::now();
  }
  return sent;
}

TEST(Flood, PeerThatNeverReadsItsRepliesIsThrottledThenClosed) {
  LogCounter log;
  Options o = test_options();
  o.set("peer_timeout", "2s").set("keepalive_interval", "500ms").set("log_level", "info");
  // The stream counts the peer's silence from its own last write, the kernel's TCP_USER_TIMEOUT
  // (twice peer_timeout) from when the peer's window closed: a small send buffer fills at once
  // after that, so the first stays well ahead of the second however slow the server (a sanitizer
  // build), and the close checked below is the stream's. The replies still back up to
  // max_reply_backlog in the server, which is what stops its reading.
  o.set("socket_buffer", "64K");
  Server s = make_server(o);
  Buffer target = poisoned(MemSpec{}, 4096);
  auto reg = s.ctx.register_memory(target.region());
  ASSERT_TRUE(reg.ok());
  const uint64_t key = reg->remote().key;
  auto peer = RawPeer::connect(s.listener.address(), kHostileKey);
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  auto ep = s.listener.accept(10s);
  ASSERT_TRUE(ep.ok());
  uint64_t rss0 = rss_kib();
  // Zero-length writes to a real key: each is legal and earns an ACK, so only back-pressure helps.
  auto t0 = Clock::now();
  uint64_t sent = flood(*peer, [&](uint64_t i) { return frame(FrameType::kWriteData, i + 1, key, 0, 0); }, 1500ms,
                        20'000'000);
  auto flooded = Clock::now() - t0;
  uint64_t grown = rss_kib() - std::min(rss_kib(), rss0);
  // The server stopped reading after at most max_reply_backlog (4 MiB) of replies; what the peer
  // got out is that plus the sockets' buffers, not the 20 M frames it tried.
  EXPECT_LT(sent, 2'000'000u) << "the server kept reading from a peer that reads nothing";
  EXPECT_LT(grown, (kSanitized ? 1024u : 64u) * 1024) << "server memory grew by " << grown << " KiB";
  expect_serves_a_good_client(s);  // while the flooder is throttled
  // It read none of its replies for peer_timeout: closed, with a reason that says so.
  Status health = wait_for_failure(*ep, 10s);
  EXPECT_EQ(health.code(), Code::kResourceExhausted) << health.to_string();
  EXPECT_NE(health.message().find("read none of its"), std::string::npos) << health.to_string();
  EXPECT_FALSE(health.peer().empty());
  EXPECT_LT(log.lines(), 20u) << "a flood must not flood the log";
  RecordProperty("frames_sent", std::to_string(sent));
  RecordProperty("rss_growth_kib", std::to_string(grown));
  std::printf("flood: %llu frames in %.1f s, server RSS +%llu KiB, %llu log lines\n",
              static_cast<unsigned long long>(sent), std::chrono::duration<double>(flooded).count(),
              static_cast<unsigned long long>(grown), static_cast<unsigned long long>(log.lines()));
}

TEST(Flood, RefusedRequestsUseUpTheErrorBudgetAndLogLittle) {
  LogCounter log;
  Options o = test_options();
  o.set("peer_error_budget", "500").set("log_level", "info");
  Server s = make_server(o);
  auto peer = RawPeer::connect(s.listener.address(), kHostileKey);
  ASSERT_TRUE(peer.ok());
  auto ep = s.listener.accept(10s);
  ASSERT_TRUE(ep.ok());
  uint64_t rss0 = rss_kib();
  // READ_REQ for a key nobody registered, as fast as the socket takes them.
  uint64_t sent = flood(*peer, [](uint64_t i) { return frame(FrameType::kReadReq, i + 1, 0xbadbad, 0, 64); }, 1500ms,
                        100'000);
  uint64_t grown = rss_kib() - std::min(rss_kib(), rss0);
  Status health = wait_for_failure(*ep, 10s);
  EXPECT_EQ(health.code(), Code::kResourceExhausted) << health.to_string();
  EXPECT_NE(health.message().find("peer_error_budget"), std::string::npos) << health.to_string();
  EXPECT_NE(health.message().find("unknown remote key"), std::string::npos) << health.to_string();
  EXPECT_LT(log.lines(), 10u) << "refusals must be rate-limited in the log";
  EXPECT_GT(sent, 500u);
  expect_serves_a_good_client(s);
  std::printf("refusal flood: %llu frames sent, closed after the budget; server RSS +%llu KiB, %llu log lines\n",
              static_cast<unsigned long long>(sent), static_cast<unsigned long long>(grown),
              static_cast<unsigned long long>(log.lines()));
}

TEST(Flood, UnexpectedEagerMessagesStopAtTheBudget) {
  LogCounter log;
  Options o = test_options();
  o.set("unexpected_budget", "16M").set("log_level", "info");
  Server s = make_server(o);
  auto peer = RawPeer::connect(s.listener.address(), kHostileKey);
  ASSERT_TRUE(peer.ok());
  auto ep = s.listener.accept(10s);
  ASSERT_TRUE(ep.ok());
  uint64_t rss0 = rss_kib();
  // 16 KiB eager messages to a tag nobody receives, far past the 16 MiB the server buffers.
  std::vector<unsigned char> payload(16 << 10, 0x5c);
  uint64_t sent = 0;
  for (uint64_t i = 1; i <= 4096; ++i, ++sent) {
    auto h = frame(FrameType::kEager, i, 77);
    h.payload_len = static_cast<uint32_t>(payload.size());
    if (!peer->send(h, payload).ok()) break;
  }
  Status health = wait_for_failure(*ep, 10s);
  uint64_t grown = rss_kib() - std::min(rss_kib(), rss0);
  EXPECT_EQ(health.code(), Code::kProtocol) << health.to_string();
  EXPECT_NE(health.message().find("budget"), std::string::npos) << health.to_string();
  EXPECT_LT(grown, (kSanitized ? 1024u : 48u) * 1024) << "the budget is 16 MiB; grew " << grown << " KiB";
  EXPECT_LT(log.lines(), 5u);
  std::printf("eager flood: closed after %llu messages of 16 KiB (budget 16 MiB); server RSS +%llu KiB\n",
              static_cast<unsigned long long>(sent), static_cast<unsigned long long>(grown));
}

TEST(Flood, NotificationsTheApplicationDoesNotTakeAreBounded) {
  Options o = test_options();
  o.set("max_notifications", "100");
  Pair p = connect_pair(o);
  Buffer target = poisoned(MemSpec{}, 64);
  auto reg = p.ctx.register_memory(target.region());
  ASSERT_TRUE(reg.ok());
  Filled src = filled(MemSpec{}, 8);
  OpOptions notify;
  notify.notify = true;
  for (int i = 0; i < 100; ++i)
    ASSERT_TRUE(p.client.write(src.buf.region(), reg->remote(), 0, notify).wait(10s).ok());
  Status refused = p.client.write(src.buf.region(), reg->remote(), 0, notify).wait(10s);
  EXPECT_EQ(refused.code(), Code::kResourceExhausted) << refused.to_string();
  EXPECT_NE(refused.message().find("max_notifications"), std::string::npos) << refused.to_string();
  EXPECT_TRUE(p.server.health().ok()) << "one refusal is not a reason to close";
  ASSERT_TRUE(p.server.next_notification(1s).ok());  // taking one makes room again
  EXPECT_TRUE(p.client.write(src.buf.region(), reg->remote(), 0, notify).wait(10s).ok());
}

}  // namespace
}  // namespace dmx::test
