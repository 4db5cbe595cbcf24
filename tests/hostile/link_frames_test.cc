// A peer that lies in the multilink control frames (protocol 7, wire/frame.h: LINK_ACK, LINK_DOWN;
// endpoint/links.cc, endpoint/control.cc): counts beyond what was sent on a stream, counts that go
// backwards, streams out of range, a second LINK_DOWN that disagrees with the first, LINK_DOWN for
// the control stream with data counts, a2 (its count of our control frames) beyond what we sent,
// link frames on an endpoint without several links. Each lie closes that peer with a message that
// names it and says what was wrong, a pending receive fails rather than hangs, and the server goes
// on serving others. A LINK_DOWN for the control stream is no lie: control moves to a data stream. Counts that go backwards are no lie: LINK_ACK and LINK_DOWN are cumulative and
// sent again after the control stream moves, so an older one arrives late by design; they are
// ignored, and the endpoint still reads what follows.
#include <poll.h>

#include <map>

#include "hostile_util.h"

namespace dmx {
namespace {

using namespace std::chrono_literals;
using test::expect_serves_a_good_client;
using test::frame;
using test::kHostileKey;
using test::make_server;
using test::poisoned;
using test::RawPeer;
using test::Server;
using wire::FrameType;

// A raw peer with several links (sockets 0: control, 1 and 2: data) and the server's endpoint to
// it, with a receive pending that must fail, not hang, when the peer is closed.
struct LinkPeer {
  std::optional<RawPeer> peer;
  Endpoint ep;
  Buffer dst = poisoned(MemSpec{}, 4096);
  Request pending;
  std::map<size_t, uint64_t> landed;  // data frames the server sent on each data socket, read here
};

std::unique_ptr<LinkPeer> link_peer(Server& s, bool multilink = true) {
  auto lp = std::make_unique<LinkPeer>();
  auto peer = RawPeer::connect(s.listener.address(), kHostileKey, 2, multilink);
  EXPECT_TRUE(peer.ok()) << peer.status().to_string();
  if (!peer.ok()) return nullptr;
  lp->peer.emplace(std::move(*peer));
  auto ep = s.listener.accept(10s);
  EXPECT_TRUE(ep.ok()) << ep.status().to_string();
  if (!ep.ok()) return nullptr;
  lp->ep = std::move(*ep);
  lp->pending = lp->ep.recv(lp->dst.region(), 999);
  return lp;
}

// The peer reads `len` bytes of the server's memory (key) and takes every READ_DATA off the data
// sockets, counting them per socket: what the server has sent on each stream.
void read_region(LinkPeer& lp, uint64_t key, uint64_t len) {
  ASSERT_TRUE(lp.peer->send(frame(FrameType::kReadReq, 1, key, 0, len)).ok());
  uint64_t got = 0;
  auto until = Clock::now() + test::kEventually;
  while (got < len && Clock::now() < until) {
    pollfd fds[2] = {{lp.peer->fd(1), POLLIN, 0}, {lp.peer->fd(2), POLLIN, 0}};
    if (::poll(fds, 2, 1000) <= 0) continue;
    for (size_t i = 0; i < 2; ++i) {
      if ((fds[i].revents & POLLIN) == 0) continue;
      auto f = lp.peer->read(i + 1, 2 << 20);
      ASSERT_TRUE(f.ok()) << f.status().to_string();
      ASSERT_EQ(f->header.type, FrameType::kReadData) << wire::describe(f->header);
      got += f->payload.size();
      ++lp.landed[i + 1];
    }
  }
  ASSERT_EQ(got, len) << "the server's answer to the read";
}

// Sends `frames` and returns the server endpoint's error, checking that it names the peer and that
// the pending receive failed.
Status provoke(LinkPeer& lp, const std::vector<wire::FrameHeader>& frames) {
  for (const auto& h : frames) (void)lp.peer->send(h);
  Status st = lp.pending.wait(10s);
  EXPECT_NE(st.code(), Code::kTimeout) << "a pending recv hung after the peer misbehaved";
  Status health = test::wait_for_failure(lp.ep, 10s);
  EXPECT_FALSE(health.ok()) << "the peer was not closed";
  EXPECT_FALSE(health.peer().empty()) << "the error must name the peer: " << health.to_string();
  return health;
}

wire::FrameHeader link_ack(uint64_t stream, uint64_t landed, uint64_t ctl_landed = 0) {
  return frame(FrameType::kLinkAck, 0, stream, landed, ctl_landed);
}
wire::FrameHeader link_down(uint64_t stream, uint64_t landed, uint64_t ctl_landed = 0) {
  return frame(FrameType::kLinkDown, 0, stream, landed, ctl_landed);
}

// The socket that carried the most of the read: at least one frame went there.
size_t busiest(const LinkPeer& lp) {
  size_t k = 1;
  for (const auto& [i, n] : lp.landed)
    if (n > lp.landed.at(k)) k = i;
  return k;
}

struct Fixture {
  Server s = make_server();
  Buffer source = poisoned(MemSpec{}, 3 << 20);
  Registration reg;
  Fixture() {
    auto r = s.ctx.register_memory(source.region());
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    reg = std::move(*r);
  }
};

void expect_says(const Status& st, const std::string& what) {
  EXPECT_EQ(st.code(), Code::kProtocol) << st.to_string();
  EXPECT_NE(st.to_string().find(what), std::string::npos) << "want '" << what << "' in: " << st.to_string();
}

TEST(LinkFrames, AnAckOfMoreFramesThanWereSentOnTheStreamClosesThePeer) {
  Fixture f;
  auto lp = link_peer(f.s);
  ASSERT_TRUE(lp);
  ASSERT_NO_FATAL_FAILURE(read_region(*lp, f.reg.remote().key, 3 << 20));
  size_t k = busiest(*lp);
  uint64_t n = lp->landed[k];
  ASSERT_GT(n, 0u);
  Status st = provoke(*lp, {link_ack(k, n + 1)});
  expect_says(st, fmt::format("{} frames acknowledged, but {} were sent", n + 1, n));
  expect_serves_a_good_client(f.s);
}

TEST(LinkFrames, AnAckOnAStreamThatSentNothingClosesThePeer) {
  Fixture f;
  auto lp = link_peer(f.s);
  ASSERT_TRUE(lp);
  Status st = provoke(*lp, {link_ack(1, 1)});
  expect_says(st, "1 frames acknowledged, but 0 were sent");
  expect_serves_a_good_client(f.s);
}

// Cumulative counts sent again after a move: an older one is ignored, and what follows is still
// read (the lie after them is caught, naming what it was).
TEST(LinkFrames, CountsThatGoBackwardsAreIgnoredAndTheEndpointReadsOn) {
  Fixture f;
  auto lp = link_peer(f.s);
  ASSERT_TRUE(lp);
  ASSERT_NO_FATAL_FAILURE(read_region(*lp, f.reg.remote().key, 3 << 20));
  size_t k = busiest(*lp);
  uint64_t n = lp->landed[k];
  ASSERT_GT(n, 0u);
  for (const auto& h : {link_ack(k, n), link_ack(k, n - 1), link_ack(k, 0), link_ack(0, 0)})
    ASSERT_TRUE(lp->peer->send(h).ok());
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(lp->ep.health().ok()) << lp->ep.health().to_string();
  Status st = provoke(*lp, {link_ack(k, n + 5)});
  expect_says(st, fmt::format("{} frames acknowledged, but {} were sent", n + 5, n));
  expect_serves_a_good_client(f.s);
}

TEST(LinkFrames, AStreamOutOfRangeClosesThePeer) {
  for (uint64_t stream : {uint64_t{3}, uint64_t{65535}, uint64_t{1} << 63, ~uint64_t{0}}) {
    for (FrameType t : {FrameType::kLinkAck, FrameType::kLinkDown}) {
      SCOPED_TRACE(fmt::format("{} for stream {}", t == FrameType::kLinkAck ? "LINK_ACK" : "LINK_DOWN", stream));
      Fixture f;
      auto lp = link_peer(f.s);
      ASSERT_TRUE(lp);
      Status st = provoke(*lp, {frame(t, 0, stream, 0, 0)});
      expect_says(st, fmt::format("for stream {}, of 3 streams", stream));
    }
  }
  Fixture f;
  expect_serves_a_good_client(f.s);
}

TEST(LinkFrames, DataCountsForTheControlStreamCloseThePeer) {
  for (FrameType t : {FrameType::kLinkAck, FrameType::kLinkDown}) {
    Fixture f;
    auto lp = link_peer(f.s);
    ASSERT_TRUE(lp);
    Status st = provoke(*lp, {frame(t, 0, 0, 7, 0)});
    expect_says(st, "counts 7 data frames on stream 0, the control stream");
    expect_serves_a_good_client(f.s);
  }
}

TEST(LinkFrames, ControlFramesLandedBeyondThoseSentClosesThePeer) {
  for (FrameType t : {FrameType::kLinkAck, FrameType::kLinkDown}) {
    Fixture f;
    auto lp = link_peer(f.s);
    ASSERT_TRUE(lp);
    Status st = provoke(*lp, {frame(t, 0, t == FrameType::kLinkAck ? 0 : 1, 0, 1000)});
    expect_says(st, "1000 of our control frames landed, but");
    expect_serves_a_good_client(f.s);
  }
}

TEST(LinkFrames, ALinkDownLandingMoreThanWasSentClosesThePeer) {
  Fixture f;
  auto lp = link_peer(f.s);
  ASSERT_TRUE(lp);
  ASSERT_NO_FATAL_FAILURE(read_region(*lp, f.reg.remote().key, 3 << 20));
  size_t k = busiest(*lp);
  uint64_t n = lp->landed[k];
  Status st = provoke(*lp, {link_down(k, n + 1)});
  expect_says(st, fmt::format("{} frames landed of {} sent", n + 1, n));
  expect_serves_a_good_client(f.s);
}

TEST(LinkFrames, ALinkDownBelowWhatItAcknowledgedClosesThePeer) {
  Fixture f;
  auto lp = link_peer(f.s);
  ASSERT_TRUE(lp);
  ASSERT_NO_FATAL_FAILURE(read_region(*lp, f.reg.remote().key, 3 << 20));
  size_t k = busiest(*lp);
  uint64_t n = lp->landed[k];
  ASSERT_TRUE(lp->peer->send(link_ack(k, n)).ok());
  Status st = provoke(*lp, {link_down(k, n - 1)});
  expect_says(st, fmt::format("{} frames landed of {} sent", n - 1, n));
  expect_serves_a_good_client(f.s);
}

// The same LINK_DOWN again is a repeat (sent again after the control stream moved); one that
// disagrees with the first is a lie.
TEST(LinkFrames, ASecondLinkDownThatDisagreesClosesThePeer) {
  Fixture f;
  auto lp = link_peer(f.s);
  ASSERT_TRUE(lp);
  ASSERT_NO_FATAL_FAILURE(read_region(*lp, f.reg.remote().key, 3 << 20));
  size_t k = busiest(*lp);
  uint64_t n = lp->landed[k];
  ASSERT_TRUE(lp->peer->send(link_down(k, n)).ok());
  ASSERT_TRUE(lp->peer->send(link_down(k, n)).ok());
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(lp->ep.health().ok()) << "a repeated LINK_DOWN: " << lp->ep.health().to_string();
  Status st = provoke(*lp, {link_down(k, n - 1)});
  expect_says(st, fmt::format("a second one, {} frames landed where the first said {}", n - 1, n));
  expect_serves_a_good_client(f.s);
}

// LINK_DOWN for stream 0 (its control stream's link died, the peer says) is no lie, even when
// repeated: control frames move to a data stream, which the endpoint goes on reading (a lie sent
// there is caught).
TEST(LinkFrames, ALinkDownForTheControlStreamMovesItAndTheEndpointReadsOn) {
  Fixture f;
  auto lp = link_peer(f.s);
  ASSERT_TRUE(lp);
  ASSERT_TRUE(lp->peer->send(link_down(0, 0)).ok());
  ASSERT_TRUE(lp->peer->send(link_down(0, 0)).ok());
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(lp->ep.health().ok()) << lp->ep.health().to_string();
  wire::HeaderBytes b = wire::encode_header(link_ack(1, 99));
  ASSERT_TRUE(stream::send_exact(lp->peer->fd(1), b.data(), b.size(), Deadline::after(10s), "server").ok());
  Status st = provoke(*lp, {});
  expect_says(st, "99 frames acknowledged, but 0 were sent");
  expect_serves_a_good_client(f.s);
}

// Every data stream said down: no link is left, the endpoint fails saying so (not a hang).
TEST(LinkFrames, EveryDataStreamDownFailsTheEndpoint) {
  Fixture f;
  auto lp = link_peer(f.s);
  ASSERT_TRUE(lp);
  Status st = provoke(*lp, {link_down(1, 0), link_down(2, 0)});
  EXPECT_EQ(st.code(), Code::kPeerFailed) << st.to_string();
  EXPECT_NE(st.to_string().find("no link to the peer is left"), std::string::npos) << st.to_string();
  expect_serves_a_good_client(f.s);
}

TEST(LinkFrames, LinkFramesWithoutSeveralLinksCloseThePeer) {
  for (FrameType t : {FrameType::kLinkAck, FrameType::kLinkDown}) {
    Fixture f;
    auto lp = link_peer(f.s, /*multilink=*/false);
    ASSERT_TRUE(lp);
    Status st = provoke(*lp, {frame(t, 0, 1, 0, 0)});
    expect_says(st, "on an endpoint without several links");
    expect_serves_a_good_client(f.s);
  }
}

}  // namespace
}  // namespace dmx
