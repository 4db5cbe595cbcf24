// Striping over TCP streams: with no payload path, every stream pulls chunks while its pipeline
// has room, and none may hold more than one chunk beyond the least loaded (the tcp transport's
// striping, transport/tcp/striping.cc), so the chunks of large messages spread over the streams rather
// than filling the pipeline of the one that happens to be turned first. Beside more than one
// data stream, stream 0 is the control stream and pulls none.
#include <gtest/gtest.h>
#include <poll.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>

#include "engine/raw_peer.h"
#include "engine/test_util.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;

// Three 16 MiB messages (16 chunks each) at once on 8 streams with pipelines 32 chunks deep: a
// stream that took all it had room for would carry one message or more alone (without the rule,
// one or two streams carried everything here). The bound holds whether stream 0 carries data or
// only control frames: no stream carries half of the bytes, and at least 4 carry a real share.
TEST(Balance, ChunksSpreadOverTheStreams) {
  constexpr int kStreams = 8, kMessages = 3;
  Pair p = connect_pair(test_options(kStreams).set("transport", "tcp").set("staging_slots", "32"));
  ASSERT_EQ(p.client.stats().transport, "tcp");
  std::vector<std::vector<unsigned char>> src, dst;
  std::vector<Request> recvs, sends;
  for (int i = 0; i < kMessages; ++i) {
    size_t n = (16u << 20) - 1 - static_cast<size_t>(i);  // odd sizes: the last chunk is short
    src.push_back(random_bytes(n));
    dst.emplace_back(n, 0xA5);
    recvs.push_back(p.server.recv(MemRegion{dst.back().data(), n, {}}, static_cast<uint64_t>(i)));
  }
  for (int i = 0; i < kMessages; ++i)
    sends.push_back(p.client.send(MemRegion{src[i].data(), src[i].size(), {}}, static_cast<uint64_t>(i)));
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE(sends[i].wait(kEventually).ok()) << sends[i].status().to_string();
    ASSERT_TRUE(recvs[i].wait(kEventually).ok()) << recvs[i].status().to_string();
    ASSERT_EQ(src[i], dst[i]) << "message " << i;
  }

  std::vector<uint64_t> per = p.client.stats().stream_bytes_sent;
  ASSERT_GE(per.size(), static_cast<size_t>(kStreams));
  uint64_t total = std::accumulate(per.begin(), per.end(), uint64_t{0});
  uint64_t payload = 0;
  for (const auto& s : src) payload += s.size();
  ASSERT_GE(total, payload);
  uint64_t most = *std::max_element(per.begin(), per.end());
  // A real share: a quarter of what each of 8 streams would carry if all were equal.
  auto carrying = std::count_if(per.begin(), per.end(), [&](uint64_t b) { return b >= total / 32; });
  std::string shares;
  for (uint64_t b : per) shares += std::to_string(b * 100 / total) + "% ";
  std::printf("bytes per stream: %s\n", shares.c_str());
  EXPECT_LE(most, total / 2) << "one stream carried most of the bytes: " << shares;
  EXPECT_GE(carrying, 4) << "fewer than 4 streams carried a real share: " << shares;
}

// Beside more than one data stream, stream 0 carries control frames only: a rendezvous message's
// chunks all go on the data streams, and an eager one (no CTS to wait for) on stream 0. With one
// data stream, that stream is stream 0 and carries everything.
TEST(Balance, TheControlStreamCarriesNoChunks) {
  for (int streams : {1, 3}) {
    SCOPED_TRACE(streams);
    Pair p = connect_pair(test_options(streams).set("transport", "tcp"));
    EndpointStats st = p.client.stats();
    ASSERT_EQ(st.streams, streams == 1 ? 1u : static_cast<uint32_t>(streams) + 1) << "and a control stream";
    std::vector<unsigned char> big = random_bytes((4u << 20) + 3), small = random_bytes(100);
    std::vector<unsigned char> got_big(big.size(), 0xA5), got_small(small.size(), 0xA5);
    Request rb = p.server.recv(MemRegion{got_big.data(), got_big.size(), {}}, 1);
    Request rs = p.server.recv(MemRegion{got_small.data(), got_small.size(), {}}, 2);
    Request sb = p.client.send(MemRegion{big.data(), big.size(), {}}, 1);
    Request ss = p.client.send(MemRegion{small.data(), small.size(), {}}, 2);
    for (Request* r : {&sb, &ss, &rb, &rs}) ASSERT_TRUE(r->wait(kEventually).ok()) << r->status().to_string();
    ASSERT_EQ(big, got_big);
    ASSERT_EQ(small, got_small);
    std::vector<uint64_t> per = p.client.stats().stream_bytes_sent;
    ASSERT_EQ(per.size(), st.streams);
    uint64_t total = std::accumulate(per.begin(), per.end(), uint64_t{0});
    EXPECT_EQ(total, big.size() + small.size());
    if (streams == 1) EXPECT_EQ(per[0], total);
    else EXPECT_EQ(per[0], small.size()) << "stream 0 carried chunks of the rendezvous message";
  }
}

// The chunk sizes a sender cuts a rendezvous message of `n` bytes of `where` into, in offset
// order, as a raw receiver with `streams` data streams sees them on the wire.
std::vector<uint32_t> chunks_seen(Options o, uint16_t streams, MemSpec where, size_t n) {
  std::vector<uint32_t> lens;
  auto ctx = Context::create(o.set("transport", "tcp"));
  EXPECT_TRUE(ctx.ok()) << ctx.status().to_string();
  if (!ctx.ok()) return lens;
  auto listener = ctx->listen("tcp://127.0.0.1:0");
  EXPECT_TRUE(listener.ok());
  if (!listener.ok()) return lens;
  auto peer = RawPeer::connect(listener->address(), "dmx-test-key-0123456789", streams);
  EXPECT_TRUE(peer.ok()) << peer.status().to_string();
  if (!peer.ok()) return lens;
  auto ep = listener->accept(10s);
  EXPECT_TRUE(ep.ok());
  if (!ep.ok()) return lens;
  Filled src = filled(where, n);
  Request send = ep->send(src.buf.region(), 9);
  Result<Frame> f = Status(Code::kInternal, "unread");
  do {
    f = peer->read(0);
    EXPECT_TRUE(f.ok()) << "no RTS: " << f.status().to_string();
  } while (f.ok() && f->header.type != wire::FrameType::kRts);
  if (!f.ok()) return lens;
  const wire::FrameHeader rts = f->header;
  EXPECT_EQ(rts.a1, n) << "the RTS announces the size";
  wire::FrameHeader cts;
  cts.type = wire::FrameType::kCts;
  cts.id = rts.id;  // the message's sequence number
  cts.a0 = 77;      // our token
  EXPECT_TRUE(peer->send(cts).ok());
  // Chunks come on every data stream: read whichever socket has a frame.
  const size_t sockets = wire::stream_sockets(streams);
  std::vector<pollfd> fds;
  for (size_t i = 0; i < sockets; ++i) fds.push_back(pollfd{peer->fd(i), POLLIN, 0});
  std::vector<unsigned char> got(n, 0xA5);
  std::map<uint64_t, uint32_t> by_offset;
  for (uint64_t seen = 0; seen < n && !::testing::Test::HasFailure();) {
    int ready = ::poll(fds.data(), fds.size(), 10000);
    EXPECT_GT(ready, 0) << "the data stopped after " << seen << " bytes";
    if (ready <= 0) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if ((fds[i].revents & POLLIN) == 0) continue;
      f = peer->read(i);
      EXPECT_TRUE(f.ok()) << f.status().to_string();
      if (!f.ok()) break;
      const wire::FrameHeader& d = f->header;
      if (d.type != wire::FrameType::kSendData) continue;  // keepalives
      EXPECT_EQ(d.id, 77u);
      EXPECT_LE(d.a0 + f->payload.size(), n);
      if (d.a0 + f->payload.size() <= n) std::copy(f->payload.begin(), f->payload.end(), got.begin() + d.a0);
      by_offset[d.a0] = d.payload_len;
      seen += d.payload_len;
    }
  }
  EXPECT_EQ(got, src.data);
  wire::FrameHeader ack;  // all landed: the send completes
  ack.type = wire::FrameType::kAck;
  ack.id = cts.id;
  ack.a1 = static_cast<uint64_t>(wire::OpKind::kSend);
  EXPECT_TRUE(peer->send(ack).ok());
  EXPECT_TRUE(send.wait(kEventually).ok()) << send.status().to_string();
  for (const auto& [offset, len] : by_offset) lens.push_back(len);
  return lens;
}

// A host-memory message too small to give each data stream a chunk of chunk_size goes in
// host_chunk_size pieces, so that it still spreads; a larger one, device memory (whose chunk is its
// staging unit), and anything on one data stream (nothing to spread over) in chunk_size pieces.
TEST(Balance, SmallHostMessagesInHostChunks) {
  constexpr uint32_t kMiB = 1 << 20, kQuarter = 256 << 10;
  constexpr size_t kSmall = 2 * kMiB - 3, kLarge = 2 * kMiB + 5;  // around 2 data streams x 1 MiB
  using Lens = std::vector<uint32_t>;
  const Options o = test_options();
  Lens quarters(8, kQuarter);
  quarters.back() = kQuarter - 3;
  EXPECT_EQ(chunks_seen(o, 2, MemSpec{}, kSmall), quarters);
  EXPECT_EQ(chunks_seen(Options(o).set("host_chunk_size", "512K"), 2, MemSpec{}, kSmall),
            (Lens{512 << 10, 512 << 10, 512 << 10, (512 << 10) - 3}));
  // Never larger than the session's chunk: the receiver's limit.
  EXPECT_EQ(chunks_seen(Options(o).set("host_chunk_size", "4M"), 2, MemSpec{}, kSmall), (Lens{kMiB, kMiB - 3}));
  EXPECT_EQ(chunks_seen(o, 2, MemSpec{}, kLarge), (Lens{kMiB, kMiB, 5}));
  EXPECT_EQ(chunks_seen(o, 2, MemSpec{MemKind::kSim, 0}, kSmall), (Lens{kMiB, kMiB - 3}));
  EXPECT_EQ(chunks_seen(o, 1, MemSpec{}, kMiB - 3), (Lens{kMiB - 3}));
}

}  // namespace
}  // namespace dmx::test
