// Malformed input from an authenticated peer, wrong keys, silent and garbage pre-auth peers: each
// closes that connection with an error naming the peer and the reason; the listener and other
// endpoints keep working; nothing hangs.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <thread>

#include "hostile/hostile_util.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;
using wire::FrameHeader;
using wire::FrameType;

TEST(BadPeer, GarbageAfterHandshake) {
  Server s = make_server();
  auto peer = RawPeer::connect(s.listener.address(), kHostileKey);
  ASSERT_TRUE(peer.ok());
  auto ep = s.listener.accept(10s);
  ASSERT_TRUE(ep.ok());
  Buffer dst = poisoned(MemSpec{}, 64);
  Request pending = ep->recv(dst.region(), 1);
  auto junk = random_bytes(4096);
  ASSERT_TRUE(peer->send_bytes(junk.data(), junk.size()).ok());
  Status st = pending.wait(5s);
  EXPECT_EQ(st.code(), Code::kProtocol) << st.to_string();
  EXPECT_NE(st.to_string().find("magic"), std::string::npos) << st.to_string();
  EXPECT_NE(st.to_string().find("127.0.0.1"), std::string::npos) << st.to_string();
  expect_serves_a_good_client(s);
}

TEST(BadPeer, SendDataForUnknownToken) {
  Server s = make_server();
  FrameHeader h = frame(FrameType::kSendData, 12345, 0, 10);
  h.payload_len = 10;
  Status st = provoke(s, {{h, std::vector<unsigned char>(10, 1)}});
  EXPECT_NE(st.message().find("unknown id"), std::string::npos) << st.to_string();
  expect_serves_a_good_client(s);
}

TEST(BadPeer, EagerLargerThanTheLimit) {
  Server s = make_server();
  FrameHeader h = frame(FrameType::kEager, 1, 999);
  h.payload_len = (16 << 10) + 1;
  Status st = provoke(s, {{h, std::vector<unsigned char>(h.payload_len, 2)}});
  EXPECT_NE(st.message().find("limit"), std::string::npos) << st.to_string();
  expect_serves_a_good_client(s);
}

// A real rendezvous with a raw peer: the server's recv of 4096 bytes matches an RTS of 100 bytes
// and answers CTS; the peer then plays with the token the CTS carried.
struct Rendezvous {
  Server s = make_server();
  Result<RawPeer> peer = Status(Code::kInternal, "unset");
  Result<Endpoint> ep = Status(Code::kInternal, "unset");
  Buffer dst = poisoned(MemSpec{}, 4096);
  Request r;
  uint64_t token = 0;

  void start() {
    peer = RawPeer::connect(s.listener.address(), kHostileKey);
    ASSERT_TRUE(peer.ok());
    ep = s.listener.accept(10s);
    ASSERT_TRUE(ep.ok());
    r = ep->recv(dst.region(), 5);
    ASSERT_TRUE(peer->send(frame(FrameType::kRts, 1, 5, 100)).ok());
    unsigned char hb[wire::kHeaderSize];
    ASSERT_TRUE(stream::recv_exact(peer->fd(), hb, sizeof hb, Deadline::after(5s), "server").ok());
    auto cts = wire::decode_header(hb, wire::Limits{1 << 20, 1 << 20});
    ASSERT_TRUE(cts.ok());
    ASSERT_EQ(cts->type, FrameType::kCts);
    token = cts->a0;
  }
};

TEST(BadPeer, RendezvousChunkOutsideTheMessage) {
  Rendezvous z;
  ASSERT_NO_FATAL_FAILURE(z.start());
  auto& peer = z.peer;
  auto& r = z.r;
  auto& dst = z.dst;
  FrameHeader d = frame(FrameType::kSendData, z.token, 90, 100);
  d.payload_len = 20;
  ASSERT_TRUE(peer->send(d, std::vector<unsigned char>(20, 3)).ok());
  Status st = r.wait(5s);
  EXPECT_EQ(st.code(), Code::kProtocol) << st.to_string();
  EXPECT_NE(st.message().find("outside"), std::string::npos) << st.to_string();
  auto got = read_back(dst.region());
  for (unsigned char c : got) ASSERT_EQ(c, 0xA5) << "bytes of a bad chunk reached the buffer";
}

TEST(BadPeer, MoreDataThanAnnounced) {
  Rendezvous z;
  ASSERT_NO_FATAL_FAILURE(z.start());
  auto& peer = z.peer;
  auto& r = z.r;
  // Two overlapping chunks that together exceed the 100 announced bytes.
  for (int i = 0; i < 2; ++i) {
    FrameHeader d = frame(FrameType::kSendData, z.token, 0, 100);
    d.payload_len = 60;
    (void)peer->send(d, std::vector<unsigned char>(60, 4));
  }
  Status st = r.wait(5s);
  EXPECT_EQ(st.code(), Code::kProtocol) << st.to_string();
  EXPECT_NE(st.message().find("more than"), std::string::npos) << st.to_string();
}

// A peer that did not agree a payload path may not use one, nor release chunks it never got.
void expect_unagreed_path_refused(uint8_t path, std::string_view text) {
  Rendezvous z;
  ASSERT_NO_FATAL_FAILURE(z.start());
  FrameHeader d = frame(FrameType::kSendData, z.token, 0, 100);
  d.path = path;
  d.payload_len = 8;
  std::vector<unsigned char> len(8, 0);
  len[0] = 100;  // the descriptor of both paths: the chunk length
  ASSERT_TRUE(z.peer->send(d, len).ok());
  Status st = z.r.wait(5s);
  EXPECT_EQ(st.code(), Code::kProtocol) << st.to_string();
  EXPECT_NE(st.message().find(text), std::string::npos) << st.to_string();
}

TEST(BadPeer, PayloadPathThatWasNotAgreed) {
  expect_unagreed_path_refused(2, "path 2, which was not agreed");
}

// Path 1 is tcp, the one transport this peer agreed: its chunks ride the streams, it has no path.
TEST(BadPeer, PathIdOfTheTcpTransport) {
  expect_unagreed_path_refused(1, "path 1, whose transport (tcp) makes no path");
}

TEST(BadPeer, LastPathIdThatWasNotAgreed) {
  expect_unagreed_path_refused(wire::kMaxPathId, "path 16, which was not agreed");
}

// An EAGER whose bytes the receiver would copy out of the sender's memory: only over an agreed
// path that releases at the receiver (this peer agreed none).
TEST(BadPeer, EagerByAPathThatWasNotAgreed) {
  Server s = make_server();
  FrameHeader h = frame(FrameType::kEager, 1, 7);
  h.path = 2;
  h.payload_len = 8;
  Status st = provoke(s, {{h, std::vector<unsigned char>(8, 1)}});
  EXPECT_EQ(st.code(), Code::kProtocol) << st.to_string();
  EXPECT_NE(st.message().find("path 2, which was not agreed"), std::string::npos) << st.to_string();
  expect_serves_a_good_client(s);
}

// READ_REQ a3 / CTS a1 may name only agreed paths that need the receiver's consent (devmem).
TEST(BadPeer, ReadRequestAcceptingDevmemThatWasNotAgreed) {
  Server s = make_server();
  Buffer target = poisoned(MemSpec{}, 1000);
  auto reg = s.ctx.register_memory(target.region());
  ASSERT_TRUE(reg.ok());
  FrameHeader h = frame(FrameType::kReadReq, 1, reg->remote().key, 0, 100);
  h.a3 = 1u << 1;  // path 1: none was agreed
  Status st = provoke(s, {{h, {}}});
  EXPECT_EQ(st.code(), Code::kProtocol) << st.to_string();
  EXPECT_NE(st.message().find("names payload paths that were not agreed"), std::string::npos) << st.to_string();
  h.a3 = 1;  // bit 0: not a path
  st = provoke(s, {{h, {}}});
  EXPECT_NE(st.message().find("names payload paths that were not agreed"), std::string::npos) << st.to_string();
  expect_serves_a_good_client(s);
}

TEST(BadPeer, PathDoneForNothing) {
  Server s = make_server();
  Status st = provoke(s, {{frame(FrameType::kPathDone, 3, 1), {}}});
  EXPECT_NE(st.message().find("PATH_DONE"), std::string::npos) << st.to_string();
  expect_serves_a_good_client(s);
}

TEST(BadPeer, WriteOutsideTheRegion) {
  Server s = make_server();
  Buffer target = poisoned(MemSpec{}, 1000);
  auto reg = s.ctx.register_memory(target.region());
  ASSERT_TRUE(reg.ok());
  FrameHeader h = frame(FrameType::kWriteData, 1, reg->remote().key, 990, 20);
  h.payload_len = 20;
  Status st = provoke(s, {{h, std::vector<unsigned char>(20, 5)}});
  EXPECT_NE(st.message().find("outside"), std::string::npos) << st.to_string();
  auto got = read_back(target.region());
  for (unsigned char c : got) ASSERT_EQ(c, 0xA5) << "an out-of-bounds write touched the region";
  expect_serves_a_good_client(s);
}

TEST(BadPeer, UnexpectedEagerFloodBeyondTheBudget) {
  Options o = test_options();
  o.set("unexpected_budget", "64K");
  Server s = make_server(o);
  std::vector<std::pair<FrameHeader, std::vector<unsigned char>>> frames;
  for (uint64_t i = 1; i <= 8; ++i) {  // 8 x 16 KiB to a tag nobody receives
    FrameHeader h = frame(FrameType::kEager, i, 7);
    h.payload_len = 16 << 10;
    frames.push_back({h, std::vector<unsigned char>(h.payload_len, 6)});
  }
  Status st = provoke(s, frames);
  EXPECT_NE(st.message().find("budget"), std::string::npos) << st.to_string();
}

TEST(BadPeer, HandshakeFrameAfterHandshake) {
  Server s = make_server();
  Status st = provoke(s, {{frame(FrameType::kWelcome), {}}});
  EXPECT_NE(st.message().find("handshake frame"), std::string::npos) << st.to_string();
}

TEST(BadPeer, MessageIdsMustIncrease) {
  Server s = make_server();
  Status st = provoke(s, {{frame(FrameType::kRts, 5, 1, 100000), {}}, {frame(FrameType::kRts, 5, 1, 100000), {}}});
  EXPECT_NE(st.message().find("does not follow"), std::string::npos) << st.to_string();
}

TEST(BadPeer, UnknownKeyIsRefusedPerOperation) {
  // A stale or wrong key fails that operation on both sides; the connection stays up (keys can be
  // withdrawn while a peer still holds them, which is not an attack).
  Pair p = connect_pair();
  Filled src = filled(MemSpec{}, 5000);
  Request w = p.client.write(src.buf.region(), RemoteRegion{0xdeadbeef, 1 << 20}, 0);
  Status st = w.wait(10s);
  EXPECT_EQ(st.code(), Code::kNotFound) << st.to_string();
  EXPECT_NE(st.message().find("unknown remote key"), std::string::npos);
  Buffer dst = poisoned(MemSpec{}, 100);
  Request r = p.client.read(dst.region(), RemoteRegion{0xdeadbeef, 1 << 20}, 0);
  EXPECT_EQ(r.wait(10s).code(), Code::kNotFound);
  EXPECT_TRUE(p.client.health().ok());
  EXPECT_TRUE(p.server.health().ok());
}

TEST(Handshake, WrongKeyIsRefusedClearly) {
  Server s = make_server();
  Options o = test_options();
  o.set("auth_key", "a-different-key-9876543210");
  auto other = Context::create(o);
  ASSERT_TRUE(other.ok());
  auto c = other->connect(s.listener.address());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kAuth) << c.status().to_string();
  EXPECT_NE(c.status().message().find("key"), std::string::npos) << c.status().to_string();
  expect_serves_a_good_client(s);
}

TEST(Handshake, InsecureAgainstSecureIsRefusedClearly) {
  Server s = make_server();
  Options o = test_options();
  o.set("insecure", "true");
  auto c = Context::create(o)->connect(s.listener.address());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kAuth) << c.status().to_string();
  EXPECT_NE(c.status().message().find("insecure"), std::string::npos) << c.status().to_string();
}

TEST(Handshake, SilentAndGarbagePeersBlockNobody) {
  Options o = test_options();
  o.set("handshake_timeout", "1s");
  Server s = make_server(o);
  auto addr = *stream::parse_address(s.listener.address());
  std::vector<UniqueFd> silent;
  for (int i = 0; i < 20; ++i) silent.push_back(std::move(*stream::connect_to(addr, Deadline::after(5s))));
  UniqueFd junk = std::move(*stream::connect_to(addr, Deadline::after(5s)));
  auto bytes = random_bytes(100);
  ASSERT_TRUE(stream::send_exact(junk.get(), bytes.data(), bytes.size(), Deadline::after(5s), "x").ok());
  auto t0 = std::chrono::steady_clock::now();
  expect_serves_a_good_client(s);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 900ms) << "a good client waited behind silent ones";
  // The silent connections are dropped after the handshake timeout, told why (a REJECT naming it).
  std::string got;
  bool eof = false;
  for (auto until = std::chrono::steady_clock::now() + 5s; !eof && std::chrono::steady_clock::now() < until;) {
    pollfd pfd{silent[0].get(), POLLIN, 0};
    if (::poll(&pfd, 1, 100) != 1) continue;
    char buf[512];
    ssize_t k = ::recv(silent[0].get(), buf, sizeof buf, 0);
    if (k <= 0) eof = true;
    else got.append(buf, static_cast<size_t>(k));
  }
  EXPECT_TRUE(eof) << "the listener kept a silent connection";
  EXPECT_NE(got.find("handshake_timeout"), std::string::npos) << "no reason given: " << got.size() << " bytes";
}

}  // namespace
}  // namespace dmx::test
