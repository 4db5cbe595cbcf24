// Reconnect (reconnect_timeout, endpoint/reconnect.cc) over loopback: every socket of an endpoint
// is shut down mid-transfer (as a dead network ends them) while many messages, writes and reads of
// fresh random data are in flight. With reconnect on, the client dials again, rejoins the session
// and every operation completes byte-exact, each message delivered exactly once; with it off they
// fail as before. A peer that restarted (a new process: no such session) or is gone (nobody
// listens) fails the pending operations at once with the reason, one that never answers at the
// dial's deadline; a forged, malformed, replayed or 17th-round REJOIN is refused and the endpoint
// goes on. Idle between outages, the reconnect threads never wake; a close ends them, mid-dial too.
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "../hostile/log_lines.h"
#include "client_sockets.h"
#include "proc_threads.h"
#include "raw_peer.h"
#include "relay.h"
#include "test_util.h"
#include "engine/handshake.h"
#include "stream/socket.h"
#include "wire/frame.h"
#include "wire/handshake.h"

namespace dmx {
namespace {

using test::client_sockets;
using test::filled;
using test::poisoned;
using test::port_of;
using test::read_back;

// Every socket the client holds to the listener, both directions: the endpoint has no stream left.
void cut_all(uint16_t port) {
  for (int fd : client_sockets(port)) ::shutdown(fd, SHUT_RDWR);
}

Options reconnect_options(const std::string& timeout) {
  return test::test_options(4).set("multilink", "on").set("transport", "tcp").set("reconnect_timeout", timeout);
}

void wait_sent(const Endpoint& ep, uint64_t bytes) {
  auto until = std::chrono::steady_clock::now() + test::kEventually;
  while (ep.stats().bytes_sent < bytes && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// What a test keeps in flight: messages both ways (small ones eager, on the control stream; large
// ones rendezvous, on the data streams), writes that notify the target, and reads.
struct Traffic {
  static constexpr int kMessages = 48, kWrites = 8;
  std::vector<test::Filled> out_c, out_s;
  std::vector<Buffer> in_s, in_c;
  test::Filled target, wsrc;
  Buffer rdst;
  std::vector<Request> reqs;
  size_t wlen = (4 << 20) + 17;

  void start(test::Pair& p, Registration& reg) {
    for (int i = 0; i < kMessages; ++i) {
      size_t n = i % 3 == 0 ? (6 << 20) + 1000 * i : 1 + (i * 977) % 6000;
      out_c.push_back(filled(MemSpec{}, n));
      out_s.push_back(filled(MemSpec{}, n + 5));
      in_s.push_back(poisoned(MemSpec{}, out_c.back().data.size()));
      in_c.push_back(poisoned(MemSpec{}, out_s.back().data.size()));
    }
    // Every message of a tag is received in order: a duplicate, or one missing, shifts the rest.
    for (int i = 0; i < kMessages; ++i) {
      reqs.push_back(p.server.recv(in_s[i].region(), 1));
      reqs.push_back(p.client.recv(in_c[i].region(), 2));
    }
    for (int i = 0; i < kMessages; ++i) {
      reqs.push_back(p.client.send(out_c[i].buf.region(), 1));
      reqs.push_back(p.server.send(out_s[i].buf.region(), 2));
    }
    for (int w = 0; w < kWrites; ++w) {
      OpOptions o;
      o.notify = true;
      o.notify_value = static_cast<uint64_t>(w) + 1;
      reqs.push_back(p.client.write(wsrc.buf.region().sub(w * wlen, wlen), reg.remote(), w * wlen, o));
    }
    reqs.push_back(p.client.read(rdst.region(), reg.remote(), kWrites * wlen));
  }

  void check(test::Pair& p) {
    for (size_t i = 0; i < reqs.size(); ++i) ASSERT_TRUE(reqs[i].wait(test::kEventually).ok()) << i << ": " << reqs[i].status().to_string();
    for (int i = 0; i < kMessages; ++i) {
      EXPECT_EQ(read_back(in_s[i].region()), out_c[i].data) << "message " << i << " client -> server";
      EXPECT_EQ(read_back(in_c[i].region()), out_s[i].data) << "message " << i << " server -> client";
    }
    EXPECT_EQ(read_back(target.buf.region().sub(0, kWrites * wlen)), wsrc.data);
    std::vector<unsigned char> tail(target.data.begin() + static_cast<long>(kWrites * wlen), target.data.end());
    EXPECT_EQ(read_back(rdst.region()), tail);
    // Each write notified once: no more, no fewer.
    std::vector<uint64_t> notes;
    for (;;) {
      auto n = p.server.next_notification(std::chrono::milliseconds(notes.size() < kWrites ? 10000 : 300));
      if (!n.ok()) break;
      notes.push_back(n->value);
    }
    std::sort(notes.begin(), notes.end());
    std::vector<uint64_t> expect;
    for (int w = 1; w <= kWrites; ++w) expect.push_back(static_cast<uint64_t>(w));
    EXPECT_EQ(notes, expect);
    // One more message per tag: it is that one that lands, not a copy of an earlier one.
    auto last_c = filled(MemSpec{}, 3333), last_s = filled(MemSpec{}, 4444);
    Buffer last_in_s = poisoned(MemSpec{}, 3333), last_in_c = poisoned(MemSpec{}, 4444);
    Request r1 = p.server.recv(last_in_s.region(), 1), r2 = p.client.recv(last_in_c.region(), 2);
    Request s1 = p.client.send(last_c.buf.region(), 1), s2 = p.server.send(last_s.buf.region(), 2);
    for (Request* r : {&r1, &r2, &s1, &s2}) ASSERT_TRUE(r->wait(test::kEventually).ok()) << r->status().to_string();
    EXPECT_EQ(r1.bytes(), 3333u);
    EXPECT_EQ(read_back(last_in_s.region()), last_c.data);
    EXPECT_EQ(read_back(last_in_c.region()), last_s.data);
  }
};

// `cuts` outages mid-transfer; with `data_only` (one cut) stream 0, the control stream, stays up.
void traffic_with_cuts(int cuts, bool data_only = false) {
  test::LogLines log;
  Traffic t;  // outlives the endpoints: a failed check leaves no operation on freed buffers
  test::Pair p = test::connect_pair(reconnect_options("30s"));
  uint16_t port = port_of(p.listener.address());
  ASSERT_EQ(client_sockets(port).size(), 5u) << "stream 0 and 4 data streams";
  t.wsrc = filled(MemSpec{}, Traffic::kWrites * t.wlen);
  t.target = filled(MemSpec{}, 2 * Traffic::kWrites * t.wlen);
  t.rdst = poisoned(MemSpec{}, Traffic::kWrites * t.wlen);
  auto reg = p.ctx.register_memory(t.target.buf.region());
  ASSERT_TRUE(reg.ok()) << reg.status().to_string();
  t.start(p, *reg);
  uint64_t at = 8 << 20;
  for (int c = 0; c < cuts; ++c) {
    wait_sent(p.client, at);
    if (data_only) {
      std::vector<int> fds = client_sockets(port);  // fd order: stream 0 first (no stream was replaced yet)
      for (size_t i = 1; i < fds.size(); ++i) ::shutdown(fds[i], SHUT_RDWR);
    } else {
      cut_all(port);
    }
    at = p.client.stats().bytes_sent + (16 << 20);
  }
  t.check(p);
  EXPECT_GE(p.client.stats().reconnects, 1u);
  EXPECT_GE(p.server.stats().reconnects, 1u);
  EXPECT_TRUE(p.client.health().ok()) << p.client.health().to_string();
  EXPECT_TRUE(p.server.health().ok()) << p.server.health().to_string();
  EXPECT_FALSE(log.with("reconnected after").empty()) << "the client's log says it reconnected";
}

TEST(MultilinkReconnect, EverySocketCutMidTransferReconnectsAndDeliversEachMessageOnce) { traffic_with_cuts(1); }

TEST(MultilinkReconnect, ThreeOutagesInARow) { traffic_with_cuts(3); }

// Every data stream cut while the control stream lives: the endpoint has no link left for chunks,
// so it is an outage like any other; the rejoined round replaces stream 0 too (the control frames
// move to the round's first stream), and everything is delivered once, byte-exact.
TEST(MultilinkReconnect, EveryDataStreamCutWhileTheControlStreamLivesReconnects) { traffic_with_cuts(1, true); }

TEST(MultilinkReconnect, WithReconnectOffEverySocketCutFailsTheOperations) {
  test::Pair p = test::connect_pair(reconnect_options("0"));
  uint16_t port = port_of(p.listener.address());
  const size_t n = 256 << 20;
  auto out = filled(MemSpec{}, n);
  Buffer in = poisoned(MemSpec{}, n);
  Request r = p.server.recv(in.region(), 1);
  Request s = p.client.send(out.buf.region(), 1);
  wait_sent(p.client, 4 << 20);
  cut_all(port);
  Status ss = s.wait(test::kEventually), rs = r.wait(test::kEventually);
  if (ss.ok() && rs.ok()) GTEST_SKIP() << "the transfer finished before the cut (a very fast machine)";
  EXPECT_EQ(ss.code(), Code::kPeerFailed) << ss.to_string();
  EXPECT_EQ(p.client.stats().reconnects, 0u);
}

// The server's process is replaced by a new one on the same port (a new context: it holds no such
// session) while the client's streams are down: the client's rejoin is refused and its pending
// operations fail at once, saying the peer restarted, long before reconnect_timeout.
TEST(MultilinkReconnect, APeerThatRestartedFailsPendingOperationsWithTheReason) {
  test::Pair p = test::connect_pair(reconnect_options("60s"));
  std::string address = p.listener.address();
  uint16_t port = port_of(address);
  Buffer in = poisoned(MemSpec{}, 1 << 20);
  Request r = p.client.recv(in.region(), 9);  // nothing will come
  // A new process listens there in place of the old one (whose endpoint, cut off, then waits in
  // vain: it ends when the test does, closed during its outage).
  p.listener = Listener();
  auto ctx2 = Context::create(reconnect_options("60s"));
  ASSERT_TRUE(ctx2.ok());
  Result<Listener> l2 = Status(Code::kUnavailable, "not yet");
  auto until = std::chrono::steady_clock::now() + test::kEventually;
  while (!(l2 = ctx2->listen(address)).ok() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(l2.ok()) << l2.status().to_string();
  cut_all(port);
  auto t0 = std::chrono::steady_clock::now();
  Status rs = r.wait(test::kEventually);
  EXPECT_EQ(rs.code(), Code::kPeerFailed) << rs.to_string();
  EXPECT_NE(rs.to_string().find("restarted"), std::string::npos) << rs.to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30)) << "not at reconnect_timeout";
}

// Nobody listens any more (the peer's process is gone): the dials are refused and the pending
// operations fail with that reason, not at reconnect_timeout.
TEST(MultilinkReconnect, APeerThatIsGoneFailsPendingOperationsWithTheReason) {
  test::Pair p = test::connect_pair(reconnect_options("60s"));
  uint16_t port = port_of(p.listener.address());
  Buffer in = poisoned(MemSpec{}, 1 << 20);
  Request r = p.client.recv(in.region(), 9);
  p.listener = Listener();
  cut_all(port);
  Status rs = r.wait(test::kEventually);
  EXPECT_EQ(rs.code(), Code::kPeerFailed) << rs.to_string();
  EXPECT_NE(rs.to_string().find("refuses connections"), std::string::npos) << rs.to_string();
}

// The server side waits for the rejoin up to reconnect_timeout, then fails with the reason; the
// client (reconnect off here) failed at once.
TEST(MultilinkReconnect, NoRejoinWithinTheTimeoutFailsWithTheTimeWaited) {
  auto ctx_s = Context::create(reconnect_options("1500ms"));
  auto ctx_c = Context::create(reconnect_options("0"));
  ASSERT_TRUE(ctx_s.ok() && ctx_c.ok());
  auto l = ctx_s->listen("tcp://127.0.0.1:0");
  ASSERT_TRUE(l.ok());
  auto c = ctx_c->connect(l->address());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto s = l->accept(test::kEventually);
  ASSERT_TRUE(s.ok());
  Buffer in = poisoned(MemSpec{}, 1 << 20);
  Request r = s->recv(in.region(), 9);
  cut_all(port_of(l->address()));
  Status rs = r.wait(test::kEventually);
  EXPECT_EQ(rs.code(), Code::kPeerFailed) << rs.to_string();
  EXPECT_NE(rs.to_string().find("did not rejoin within"), std::string::npos) << rs.to_string();
}

// A cancel during the outage completes (the streams are gone: the reconnect thread runs deadlines
// and cancels), and the endpoint goes on once reconnected.
TEST(MultilinkReconnect, ACancelDuringTheOutageCompletes) {
  test::Pair p = test::connect_pair(reconnect_options("30s"));
  uint16_t port = port_of(p.listener.address());
  Buffer in = poisoned(MemSpec{}, 1 << 20);
  Request r = p.client.recv(in.region(), 9);
  cut_all(port);
  r.cancel();
  Status rs = r.wait(test::kEventually);
  EXPECT_EQ(rs.code(), Code::kCancelled) << rs.to_string();
  auto out = filled(MemSpec{}, (3 << 20) + 1);
  Buffer got = poisoned(MemSpec{}, out.data.size());
  Request rr = p.server.recv(got.region(), 4), ss = p.client.send(out.buf.region(), 4);
  ASSERT_TRUE(ss.wait(test::kEventually).ok()) << ss.status().to_string();
  ASSERT_TRUE(rr.wait(test::kEventually).ok()) << rr.status().to_string();
  EXPECT_EQ(read_back(got.region()), out.data);
}

// A message of fresh random data each way, checked byte for byte.
void exchange(test::Pair& p, size_t n, uint64_t tag) {
  auto out_c = filled(MemSpec{}, n), out_s = filled(MemSpec{}, n + 7);
  Buffer in_s = poisoned(MemSpec{}, n), in_c = poisoned(MemSpec{}, n + 7);
  Request r1 = p.server.recv(in_s.region(), tag), r2 = p.client.recv(in_c.region(), tag);
  Request s1 = p.client.send(out_c.buf.region(), tag), s2 = p.server.send(out_s.buf.region(), tag);
  for (Request* r : {&r1, &r2, &s1, &s2}) ASSERT_TRUE(r->wait(test::kEventually).ok()) << r->status().to_string();
  EXPECT_EQ(read_back(in_s.region()), out_c.data);
  EXPECT_EQ(read_back(in_c.region()), out_s.data);
}

// Every socket cut and the session healed: both sides counted reconnect `n`, and a transfer after it
// delivers.
void outage_healed(test::Pair& p, uint64_t n = 1) {
  cut_all(port_of(p.listener.address()));
  exchange(p, (3 << 20) + 11, 77);
  auto until = std::chrono::steady_clock::now() + test::kEventually;
  while ((p.client.stats().reconnects < n || p.server.stats().reconnects < n) &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(p.client.stats().reconnects, n);
  ASSERT_EQ(p.server.stats().reconnects, n);
}

// The reconnect thread of an endpoint that had an outage sleeps until the next outage or the
// endpoint's end: idle, it costs no wake-up (it used to wake once a second, forever).
TEST(MultilinkReconnect, AfterAnOutageTheIdleReconnectThreadsNeverWake) {
  test::Pair p = test::connect_pair(reconnect_options("30s"));
  ASSERT_NO_FATAL_FAILURE(outage_healed(p));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // back from the outage's last tick
  // The client's, and the server's unless the rejoin came before it saw its streams go.
  ThreadWakeups before = thread_wakeups("dmx-reconnect");
  ASSERT_GE(before.threads, 1) << "the client's reconnect thread";
  std::this_thread::sleep_for(std::chrono::seconds(4));
  ThreadWakeups after = thread_wakeups("dmx-reconnect");
  ASSERT_EQ(after.threads, before.threads);
  EXPECT_LE(after.wakeups - before.wakeups, 1) << "wake-ups of the idle reconnect threads in 4 s";
  EXPECT_TRUE(p.client.health().ok()) << p.client.health().to_string();
  exchange(p, (2 << 20) + 5, 78);  // still woken by the next outage, and healed by it
  ASSERT_NO_FATAL_FAILURE(outage_healed(p, 2));
}

// Closed after an outage, either side first, the endpoints end with their reconnect threads: the
// close is not held up by an idle reconnect thread.
TEST(MultilinkReconnect, AnEndpointThatHadAnOutageClosesAndItsReconnectThreadEnds) {
  for (bool client_first : {true, false}) {
    test::Pair p = test::connect_pair(reconnect_options("30s"));
    ASSERT_NO_FATAL_FAILURE(outage_healed(p));
    ASSERT_GE(thread_wakeups("dmx-reconnect").threads, 1);
    Endpoint& first = client_first ? p.client : p.server;
    Endpoint& second = client_first ? p.server : p.client;
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(first.close().ok());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, test::kLoadSlack) << "close waited on the reconnect thread";
    // The peer learns of the close, and goes without an outage.
    auto until = std::chrono::steady_clock::now() + test::kEventually;
    while (second.health().ok() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(second.health().code(), Code::kClosed) << second.health().to_string();
    second = Endpoint();  // destroyed
    first = Endpoint();
    until = std::chrono::steady_clock::now() + test::kEventually;
    while (thread_wakeups("dmx-reconnect").threads > 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(thread_wakeups("dmx-reconnect").threads, 0) << "the reconnect threads ended";
  }
}

// A socket listening on `port` of 127.0.0.1 that nobody accepts on: the kernel completes the TCP
// handshake and takes the bytes, and nothing ever answers (a hung process behind the port).
UniqueFd silent_listener(uint16_t port) {
  auto until = std::chrono::steady_clock::now() + test::kEventually;
  for (;;) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd.get(), 64) == 0) return fd;
    if (std::chrono::steady_clock::now() > until) return UniqueFd();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// The peer's port is taken by a process that accepts the connection and never answers: the
// client's REJOIN goes unanswered. The dial gives up at its deadline (here reconnect_timeout,
// shorter than handshake_timeout) and the endpoint fails with the reason and the time waited;
// nothing hangs, and the endpoint's close returns.
TEST(MultilinkReconnect, ARejoinThatIsNeverAnsweredFailsAtItsDeadline) {
  test::Pair p = test::connect_pair(reconnect_options("3s").set("handshake_timeout", "60s"));
  uint16_t port = port_of(p.listener.address());
  Buffer in = poisoned(MemSpec{}, 1 << 20);
  Request r = p.client.recv(in.region(), 9);  // nothing will come
  p.listener = Listener();
  UniqueFd silent = silent_listener(port);
  ASSERT_TRUE(silent.valid()) << "could not listen on port " << port << " again";
  cut_all(port);
  Status rs = r.wait(test::kEventually);
  EXPECT_EQ(rs.code(), Code::kPeerFailed) << rs.to_string();
  EXPECT_NE(rs.to_string().find("got no answer"), std::string::npos) << rs.to_string();
  EXPECT_NE(rs.to_string().find("reconnect_timeout 3000 ms"), std::string::npos) << rs.to_string();
  EXPECT_EQ(p.client.health().code(), Code::kPeerFailed) << p.client.health().to_string();
  EXPECT_TRUE(p.client.close().ok());
}

// Sends a REJOIN with `payload` on a fresh connection; returns the listener's answer frame type.
Result<wire::FrameType> send_rejoin(const std::string& address, const std::vector<unsigned char>& payload) {
  DMX_ASSIGN_OR_RETURN(stream::Address addr, stream::parse_address(address));
  Deadline d = Deadline::after(std::chrono::seconds(10));
  DMX_ASSIGN_OR_RETURN(UniqueFd fd, stream::connect_to(addr, d));
  DMX_RETURN_IF_ERROR(send_frame(fd.get(), wire::FrameType::kRejoin, payload, d, "test"));
  DMX_ASSIGN_OR_RETURN(Frame f, recv_frame(fd.get(), d, "test"));
  return f.header.type;
}

// Closed while its dial waits on a peer that never answers (dial deadlines of 60 s), the client's
// endpoint ends at once: the close cuts the dial short rather than wait it out.
TEST(MultilinkReconnect, ACloseDuringAnUnansweredDialEndsTheDial) {
  test::LogLines log;
  test::Pair p = test::connect_pair(reconnect_options("60s").set("handshake_timeout", "60s"));
  uint16_t port = port_of(p.listener.address());
  Buffer in = poisoned(MemSpec{}, 1 << 20);
  Request r = p.client.recv(in.region(), 9);  // nothing will come
  p.listener = Listener();
  UniqueFd silent = silent_listener(port);
  ASSERT_TRUE(silent.valid()) << "could not listen on port " << port << " again";
  cut_all(port);
  auto until = std::chrono::steady_clock::now() + test::kEventually;
  while (log.with("dialing the peer again").empty() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the REJOIN went out, unanswered
  auto t0 = std::chrono::steady_clock::now();
  Status closed = p.client.close();
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(closed.ok()) << closed.to_string();
  EXPECT_LT(took, std::chrono::seconds(30)) << "close waited out the 60 s dial";
  EXPECT_EQ(r.wait(test::kEventually).code(), Code::kClosed) << r.status().to_string();
  p.client = Endpoint();
  until = std::chrono::steady_clock::now() + test::kEventually;
  while (thread_wakeups("dmx-reconnect").threads > 1 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_LE(thread_wakeups("dmx-reconnect").threads, 1) << "the client's reconnect thread ended";
}

// The listener's answer to a REJOIN as a Status: ok for WELCOME, else the REJECT's code and text.
Status answer_of(const Frame& f) {
  if (f.header.type == wire::FrameType::kWelcome) return Status();
  if (f.header.type != wire::FrameType::kReject) return Status(Code::kInternal, "neither WELCOME nor REJECT");
  return Status(static_cast<Code>(f.header.a0), std::string(f.payload.begin(), f.payload.end()));
}

// An endpoint takes 16 reconnects (rounds of at most `streams` - 1 rejoined streams); a client that
// rejoins once more is refused with kResourceExhausted, and the endpoint and everyone else go on.
// The client here is raw: it sends each REJOIN as dmx would, one stream a round.
TEST(MultilinkReconnect, ARejoinPastTheSixteenthReconnectIsRefused) {
  test::LogLines log;
  test::Pair p = test::connect_pair(reconnect_options("30s"));  // another endpoint of the same listener
  auto raw = test::RawPeer::connect(p.listener.address(), "dmx-test-key-0123456789", 4, /*multilink=*/true);
  ASSERT_TRUE(raw.ok()) << raw.status().to_string();
  auto ep = p.listener.accept(test::kEventually);
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  std::vector<UniqueFd> kept;  // the rejoined streams stay open
  // Streams 0..4 are the session's; 16 rounds of one stream each: 5, 6, ..., 20.
  for (uint16_t i = 5; i < 5 + 16; ++i) {
    UniqueFd fd;
    auto f = raw->rejoin(i, i, &fd);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    ASSERT_TRUE(answer_of(*f).ok()) << "reconnect " << i - 4 << ": " << answer_of(*f).to_string();
    kept.push_back(std::move(fd));
  }
  auto until = std::chrono::steady_clock::now() + test::kEventually;
  while (ep->stats().reconnects < 16 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(ep->stats().reconnects, 16u);
  // A 17th round is refused, with the documented code and reason.
  auto refused = raw->rejoin(21, 21);
  ASSERT_TRUE(refused.ok()) << refused.status().to_string();
  Status why = answer_of(*refused);
  EXPECT_EQ(why.code(), Code::kResourceExhausted) << why.to_string();
  EXPECT_NE(why.to_string().find("reconnected 16 times"), std::string::npos) << why.to_string();
  // The last round may still fill up (its streams are part of the 16th reconnect); no new one.
  UniqueFd fd;
  auto more = raw->rejoin(20, 21, &fd);
  ASSERT_TRUE(more.ok()) << more.status().to_string();
  EXPECT_TRUE(answer_of(*more).ok()) << answer_of(*more).to_string();
  auto again = raw->rejoin(22, 22);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(answer_of(*again).code(), Code::kResourceExhausted) << answer_of(*again).to_string();
  EXPECT_FALSE(log.with("reconnected 16 times").empty()) << "the refusal is logged";
  EXPECT_TRUE(ep->health().ok()) << ep->health().to_string();
  EXPECT_EQ(ep->stats().reconnects, 16u);
  // Everyone else goes on.
  exchange(p, (4 << 20) + 9, 5);
  EXPECT_TRUE(p.server.health().ok()) << p.server.health().to_string();
}

// The exact bytes of a REJOIN that was taken (recorded on the way by a relay between client and
// server), sent again on a new connection once the session has healed, are refused: the stream is
// not the next one any more. The live endpoint is not disturbed: it transfers byte-exact after.
TEST(MultilinkReconnect, AReplayedRejoinIsRefusedAndTheEndpointGoesOn) {
  test::LogLines log;
  auto ctx = Context::create(reconnect_options("30s"));
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  auto l = ctx->listen("tcp://127.0.0.1:0");
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  test::Relay relay(port_of(l->address()));
  ASSERT_NE(relay.port(), 0) << "the relay could not listen";
  test::Pair p;
  p.ctx = *ctx;
  p.listener = std::move(*l);
  auto c = p.ctx.connect(relay.address());  // by the relay: it dials there again too
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  p.client = std::move(*c);
  auto s = p.listener.accept(test::kEventually);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  p.server = std::move(*s);
  ASSERT_NO_FATAL_FAILURE(outage_healed(p));
  // The REJOIN that began the round (stream 5, the first after the session's 0..4).
  std::vector<unsigned char> taken;
  for (const auto& bytes : relay.first_bytes()) {
    if (bytes.size() < wire::kHeaderSize) continue;
    auto h = wire::decode_header(bytes.data(), wire::Limits{1 << 20, 1 << 20});
    if (!h.ok() || h->type != wire::FrameType::kRejoin || bytes.size() != wire::kHeaderSize + h->payload_len) continue;
    auto r = wire::decode_rejoin(bytes.data() + wire::kHeaderSize, h->payload_len);
    if (r.ok() && r->first == 5 && r->index == 5) taken = bytes;
  }
  ASSERT_FALSE(taken.empty()) << "the relay saw the REJOIN of stream 5";
  for (int replay = 0; replay < 2; ++replay) {
    auto addr = stream::parse_address(p.listener.address());
    ASSERT_TRUE(addr.ok());
    Deadline d = Deadline::after(std::chrono::seconds(30));
    auto fd = stream::connect_to(*addr, d);
    ASSERT_TRUE(fd.ok()) << fd.status().to_string();
    ASSERT_TRUE(stream::send_exact(fd->get(), taken.data(), taken.size(), d, "server").ok());
    auto answer = recv_frame(fd->get(), d, "server");
    ASSERT_TRUE(answer.ok()) << answer.status().to_string();
    Status why = answer_of(*answer);
    EXPECT_EQ(why.code(), Code::kProtocol) << why.to_string();
    EXPECT_NE(why.to_string().find("but the next is"), std::string::npos) << why.to_string();
  }
  EXPECT_FALSE(log.with("but the next is").empty()) << "the refusals are logged";
  exchange(p, (5 << 20) + 13, 6);
  EXPECT_TRUE(p.client.health().ok()) << p.client.health().to_string();
  EXPECT_TRUE(p.server.health().ok()) << p.server.health().to_string();
  EXPECT_EQ(p.client.stats().reconnects, 1u);
  EXPECT_EQ(p.server.stats().reconnects, 1u);
}

// Forged REJOINs (an unknown session, a wrong proof, a bad index, a truncated one) are refused and
// logged; the endpoint, in an outage or not, goes on and reconnects.
TEST(MultilinkReconnect, AForgedOrMalformedRejoinIsRefused) {
  test::LogLines log;
  test::Pair p = test::connect_pair(reconnect_options("30s"));
  std::string address = p.listener.address();
  wire::Rejoin forged;
  forged.session = 0x1234567890abcdefull;
  forged.first = forged.index = 5;
  forged.proof.fill(0x5a);
  auto a = send_rejoin(address, wire::encode_rejoin(forged));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(*a, wire::FrameType::kReject);
  std::vector<unsigned char> bad = wire::encode_rejoin(forged);
  bad[24] = 0;  // first = 0 (little-endian u16 at 24)
  bad[25] = 0;
  auto b = send_rejoin(address, bad);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(*b, wire::FrameType::kReject);
  bad.resize(10);
  auto c = send_rejoin(address, bad);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(*c, wire::FrameType::kReject);
  EXPECT_FALSE(log.with("REJOIN").empty()) << "the refusals are logged";
  // The endpoint goes on, through an outage too.
  cut_all(port_of(address));
  auto out = filled(MemSpec{}, (5 << 20) + 3);
  Buffer got = poisoned(MemSpec{}, out.data.size());
  Request rr = p.server.recv(got.region(), 4), ss = p.client.send(out.buf.region(), 4);
  ASSERT_TRUE(ss.wait(test::kEventually).ok()) << ss.status().to_string();
  ASSERT_TRUE(rr.wait(test::kEventually).ok()) << rr.status().to_string();
  EXPECT_EQ(read_back(got.region()), out.data);
  EXPECT_EQ(p.client.stats().reconnects, 1u);
}

}  // namespace
}  // namespace dmx
