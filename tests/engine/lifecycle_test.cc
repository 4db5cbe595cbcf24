// Operation lifecycles: completion order, cancel, deadlines, truncation, close, peer death,
// many operations in both directions at once.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <mutex>
#include <thread>

#include "dmx_test_paths.h"
#include "engine/test_util.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(Lifecycle, ReceivesCompleteInPostingOrder) {
  Pair p = connect_pair();
  std::mutex mu;
  std::vector<int> order;
  Buffer a = poisoned(MemSpec{}, 100), b = poisoned(MemSpec{}, 100);
  OpOptions oa, ob;
  oa.on_complete = [&](const Status&, size_t) { std::lock_guard<std::mutex> l(mu); order.push_back(1); };
  ob.on_complete = [&](const Status&, size_t) { std::lock_guard<std::mutex> l(mu); order.push_back(2); };
  Request ra = p.server.recv(a.region(), 1, oa);
  Request rb = p.server.recv(b.region(), 2, ob);
  Filled m2 = filled(MemSpec{}, 100), m1 = filled(MemSpec{}, 100);
  ASSERT_TRUE(p.client.send(m2.buf.region(), 2).wait(kEventually).ok());
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(rb.test()) << "the second receive completed before the first";
  ASSERT_TRUE(p.client.send(m1.buf.region(), 1).wait(kEventually).ok());
  ASSERT_TRUE(rb.wait(kEventually).ok());
  ASSERT_TRUE(ra.test());
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

TEST(Lifecycle, AnyTagAndUnexpectedMessages) {
  Pair p = connect_pair();
  Filled small = filled(MemSpec{}, 300), big = filled(MemSpec{}, 3 << 20);
  // Both arrive before any receive is posted: one eager (buffered), one rendezvous (announced).
  ASSERT_TRUE(p.client.send(small.buf.region(), 11).wait(kEventually).ok());
  Request sbig = p.client.send(big.buf.region(), 12);
  std::this_thread::sleep_for(50ms);
  Buffer d1 = poisoned(MemSpec{}, 3 << 20), d2 = poisoned(MemSpec{}, 3 << 20);
  Request r1 = p.server.recv(d1.region(), kAnyTag);
  Request r2 = p.server.recv(d2.region(), kAnyTag);
  ASSERT_TRUE(r1.wait(kEventually).ok());
  ASSERT_TRUE(r2.wait(kEventually).ok());
  ASSERT_TRUE(sbig.wait(kEventually).ok());
  EXPECT_EQ(r1.tag(), 11u);
  EXPECT_EQ(r1.bytes(), 300u);
  EXPECT_EQ(r2.tag(), 12u);
  auto g1 = read_back(d1.region().sub(0, 300));
  auto g2 = read_back(d2.region());
  EXPECT_EQ(g1, small.data);
  EXPECT_EQ(g2, big.data);
}

// A send that completed was delivered: messages that had fully arrived when the peer closed stay
// receivable, in order; one that had not (a rendezvous the sender's close failed) was never sent.
TEST(Lifecycle, MessagesThatArrivedBeforeThePeerClosedStayReceivable) {
  for (bool wait_for_stop : {false, true}) {
    SCOPED_TRACE(wait_for_stop ? "receives posted after the endpoint stopped" : "right after the close");
    Pair p = connect_pair();
    Filled a = filled(MemSpec{}, 1000), b = filled(MemSpec{}, 777), c = filled(MemSpec{}, 1),
           big = filled(MemSpec{}, 3 << 20), after = filled(MemSpec{}, 10);
    ASSERT_TRUE(p.client.send(a.buf.region(), 1).wait(kEventually).ok());
    ASSERT_TRUE(p.client.send(b.buf.region(), 2).wait(kEventually).ok());
    ASSERT_TRUE(p.client.send(c.buf.region(), 1).wait(kEventually).ok());
    ASSERT_TRUE(p.client.send(after.buf.region(), 3).wait(kEventually).ok());
    Request sbig = p.client.send(big.buf.region(), 3);  // announced, never received
    std::this_thread::sleep_for(50ms);
    ASSERT_TRUE(p.client.close().ok());
    EXPECT_EQ(sbig.wait(kEventually).code(), Code::kClosed);
    auto t0 = Clock::now();
    while (p.server.health().ok() && Clock::now() - t0 < kEventually) std::this_thread::sleep_for(1ms);
    ASSERT_EQ(p.server.health().code(), Code::kClosed) << p.server.health().to_string();
    if (wait_for_stop) std::this_thread::sleep_for(300ms);
    Buffer d = poisoned(MemSpec{}, 4096);
    Request r2 = p.server.recv(d.region(), 2);
    ASSERT_TRUE(r2.wait(kEventually).ok()) << r2.status().to_string();
    EXPECT_EQ(r2.bytes(), 777u);
    EXPECT_EQ(read_back(d.region().sub(0, 777)), b.data);
    Request r1 = p.server.recv(d.region().sub(1, 999), 1);  // too small for the first of tag 1
    EXPECT_EQ(r1.wait(kEventually).code(), Code::kTruncated);
    Request any = p.server.recv(d.region().sub(5, 1), kAnyTag);
    ASSERT_TRUE(any.wait(kEventually).ok()) << any.status().to_string();
    EXPECT_EQ(any.tag(), 1u);
    EXPECT_EQ(read_back(d.region().sub(5, 1)), c.data);
    Request r3 = p.server.recv(d.region(), 3);
    ASSERT_TRUE(r3.wait(kEventually).ok()) << r3.status().to_string();
    EXPECT_EQ(read_back(d.region().sub(0, 10)), after.data);
    // The rendezvous of tag 3 had not arrived (its send failed): nothing is left.
    EXPECT_EQ(p.server.recv(d.region(), kAnyTag).wait(kEventually).code(), Code::kClosed);  // nothing more
  }
}

// Once this side closes too, nothing the peer sent is delivered any more.
// A large send completes once its source is free — for shm, once its chunks are in the ring — and
// its sender may close at once. Its receive was posted and its chunks' headers came before the
// CLOSE: it completes byte-exact rather than failing when the receiver stops its paths.
TEST(Lifecycle, SendCompletedBeforeAnOrderlyCloseIsReceived) {
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE(round);
    Pair p = connect_pair();
    const size_t n = (64 << 20) + 3 + round;  // twice the ring: its last half is in the ring at completion
    Filled src = filled(MemSpec{}, n);
    Buffer dst = poisoned(MemSpec{}, n);
    Request r = p.server.recv(dst.region(), 5);
    ASSERT_TRUE(p.client.send(src.buf.region(), 5).wait(kEventually).ok());
    ASSERT_TRUE(p.client.close().ok());
    ASSERT_TRUE(r.wait(kEventually).ok()) << p.client.stats().transport << ": " << r.status().to_string();
    ASSERT_EQ(read_back(dst.region()), src.data);
  }
}

TEST(Lifecycle, OurOwnCloseEndsWhatThePeerLeft) {
  Pair p = connect_pair();
  Filled a = filled(MemSpec{}, 100);
  ASSERT_TRUE(p.client.send(a.buf.region(), 1).wait(kEventually).ok());
  ASSERT_TRUE(p.client.close().ok());
  auto t0 = Clock::now();
  while (p.server.health().ok() && Clock::now() - t0 < kEventually) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(p.server.health().code(), Code::kClosed);
  (void)p.server.close();
  Buffer d = poisoned(MemSpec{}, 100);
  EXPECT_EQ(p.server.recv(d.region(), 1).wait(kEventually).code(), Code::kClosed);
}

// A callback runs on a worker that also runs the streams a wait there would wait for: wait()
// refuses at once, naming why, rather than hold them up (or wait forever).
TEST(Lifecycle, WaitInACallbackIsRefusedNotAHang) {
  Pair p = connect_pair();
  Filled src = filled(MemSpec{}, 1000);
  Buffer dst = poisoned(MemSpec{}, 1000), later = poisoned(MemSpec{}, 1000);
  Request next = p.client.recv(later.region(), 2);  // never sent: waiting on it would hang
  std::promise<Status> inner;
  OpOptions o;
  o.on_complete = [&](const Status&, size_t) { inner.set_value(next.wait(5s)); };
  Request r = p.server.recv(dst.region(), 1, o);
  ASSERT_TRUE(p.client.send(src.buf.region(), 1).wait(kEventually).ok());
  ASSERT_TRUE(r.wait(kEventually).ok());
  auto got = inner.get_future();
  ASSERT_EQ(got.wait_for(30s), std::future_status::ready);
  Status s = got.get();
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("worker thread"), std::string::npos) << s.to_string();
  EXPECT_FALSE(next.test());
}

TEST(Lifecycle, TruncationFailsBothSidesAndKeepsTheEndpoint) {
  Pair p = connect_pair();
  Filled big = filled(MemSpec{}, 1 << 20), tiny = filled(MemSpec{}, 200);
  Buffer small = poisoned(MemSpec{}, 1000);
  Request r = p.server.recv(small.region(), 3);
  Request s = p.client.send(big.buf.region(), 3);
  EXPECT_EQ(r.wait(kEventually).code(), Code::kTruncated) << r.status().to_string();
  EXPECT_EQ(s.wait(kEventually).code(), Code::kTruncated) << s.status().to_string();
  for (unsigned char c : read_back(small.region())) ASSERT_EQ(c, 0xA5);
  // Eager message too large for the buffer: the receive fails; the sender completed locally.
  Request r2 = p.server.recv(small.region().sub(0, 100), 4);
  ASSERT_TRUE(p.client.send(tiny.buf.region(), 4).wait(kEventually).ok());
  EXPECT_EQ(r2.wait(kEventually).code(), Code::kTruncated);
  // The endpoint still works.
  Request r3 = p.server.recv(small.region(), 5);
  ASSERT_TRUE(p.client.send(tiny.buf.region(), 5).wait(kEventually).ok());
  ASSERT_TRUE(r3.wait(kEventually).ok());
  EXPECT_EQ(read_back(small.region().sub(0, 200)), tiny.data);
}

TEST(Lifecycle, CancelAPostedReceiveAndAnUnmatchedSend) {
  Pair p = connect_pair();
  Buffer d = poisoned(MemSpec{}, 2 << 20);
  Request r = p.server.recv(d.region(), 8);
  r.cancel();
  EXPECT_EQ(r.wait(kEventually).code(), Code::kCancelled);
  // A rendezvous send nobody receives yet, cancelled: the next message with that tag is the one
  // the receiver gets.
  Filled a = filled(MemSpec{}, 2 << 20), b = filled(MemSpec{}, 2 << 20);
  Request s1 = p.client.send(a.buf.region(), 9);
  s1.cancel();
  EXPECT_EQ(s1.wait(kEventually).code(), Code::kCancelled);
  Request s2 = p.client.send(b.buf.region(), 9);
  Request r2 = p.server.recv(d.region(), 9);
  ASSERT_TRUE(r2.wait(kEventually).ok()) << r2.status().to_string();
  ASSERT_TRUE(s2.wait(kEventually).ok());
  auto got = read_back(d.region().sub(0, 2 << 20));
  EXPECT_EQ(got, b.data);
}

class CancelMidway : public ::testing::TestWithParam<const char*> {};

TEST_P(CancelMidway, LargeTransfer) {
  Options o = test_options();
  o.set("transport", GetParam());
  Pair p = connect_pair(o);
  size_t n = 512u << 20;
  Buffer src = poisoned(MemSpec{}, n);
  Buffer dst = poisoned(MemSpec{}, n);
  Request r = p.server.recv(dst.region(), 1);
  Request s = p.client.send(src.region(), 1);
  std::this_thread::sleep_for(20ms);
  s.cancel();
  Status ss = s.wait(kEventually);
  // Either it finished before the cancel landed, or both sides say cancelled (or, when the cancel
  // came before any byte went, the receive takes the next message); never a hang.
  ASSERT_NE(ss.code(), Code::kTimeout);
  if (ss.ok()) {
    EXPECT_TRUE(r.wait(kEventually).ok()) << r.status().to_string();
  } else {
    EXPECT_EQ(ss.code(), Code::kCancelled) << ss.to_string();
    ASSERT_NO_FATAL_FAILURE(expect_cancelled_or_put_back(p.client, p.server, r, dst.region(), 1, MemSpec{}));
  }
  // The endpoint carries on.
  Filled m = filled(MemSpec{}, 5 << 20);
  Request r2 = p.server.recv(dst.region(), 2);
  ASSERT_TRUE(p.client.send(m.buf.region(), 2).wait(kEventually).ok());
  ASSERT_TRUE(r2.wait(kEventually).ok()) << r2.status().to_string();
  EXPECT_EQ(read_back(dst.region().sub(0, 5 << 20)), m.data);
}

INSTANTIATE_TEST_SUITE_P(Transports, CancelMidway, ::testing::Values("tcp", "auto"));

// A deadline fires on its own timer, not at the next keepalive (60 s here): "in time" is well
// before that, with room for a loaded machine.
TEST(Lifecycle, DeadlinesFailOperationsInTime) {
  Pair p = connect_pair(test_options().set("keepalive_interval", "60s").set("peer_timeout", "180s"));
  Buffer d = poisoned(MemSpec{}, 100);
  OpOptions o;
  o.timeout = 200ms;
  auto t0 = Clock::now();
  Request r = p.server.recv(d.region(), 77, o);
  Status s = r.wait(kEventually);
  auto took = Clock::now() - t0;
  EXPECT_EQ(s.code(), Code::kTimeout) << s.to_string();
  EXPECT_GE(took, 190ms);
  EXPECT_LT(took, 200ms + kLoadSlack);
  // A wait() that gives up leaves the operation running.
  Request r2 = p.server.recv(d.region(), 78);
  EXPECT_EQ(r2.wait(50ms).code(), Code::kTimeout);
  EXPECT_FALSE(r2.test());
  Filled m = filled(MemSpec{}, 100);
  ASSERT_TRUE(p.client.send(m.buf.region(), 78).wait(kEventually).ok());
  EXPECT_TRUE(r2.wait(kEventually).ok());
}

TEST(Lifecycle, CloseFailsPendingOperationsOnBothSides) {
  Pair p = connect_pair();
  Buffer d1 = poisoned(MemSpec{}, 100), d2 = poisoned(MemSpec{}, 100);
  Request mine = p.client.recv(d1.region(), 1);
  Request theirs = p.server.recv(d2.region(), 1);
  auto t0 = Clock::now();
  EXPECT_TRUE(p.client.close().ok());
  EXPECT_LT(Clock::now() - t0, kLoadSlack) << "close() waited for stop_timeout (30 s)";
  EXPECT_EQ(mine.wait(kEventually).code(), Code::kClosed);
  Status ts = theirs.wait(kEventually);
  EXPECT_EQ(ts.code(), Code::kClosed) << ts.to_string();
  EXPECT_NE(ts.message().find("peer closed"), std::string::npos) << ts.to_string();
  // Operations after close fail at once, through the same completion path.
  bool called = false;
  OpOptions o;
  o.on_complete = [&](const Status& s, size_t) { called = s.code() == Code::kClosed; };
  EXPECT_EQ(p.client.send(d1.region(), 1, o).wait(1s).code(), Code::kClosed);
  EXPECT_TRUE(called);
}

// A real peer process: `dmx bench --connect` sends its plan, then we kill or stop it.
pid_t start_bench_client(const std::string& addr) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("DMX_AUTH_KEY", "dmx-test-key-0123456789", 1);
    ::execl(DMX_BIN_PATH, "dmx", "bench", "--connect", addr.c_str(), "--mem", "host", "--sizes", "64M", "--iters",
            "1000000", nullptr);
    ::_exit(127);
  }
  return pid;
}

void peer_dies(int sig, Options o, std::chrono::seconds bound) {  // bound: from the signal
  o.set("auth_key", "dmx-test-key-0123456789");
  auto ctx = Context::create(o);
  ASSERT_TRUE(ctx.ok());
  auto l = ctx->listen("tcp://127.0.0.1:0");
  ASSERT_TRUE(l.ok());
  pid_t child = start_bench_client(l->address());
  auto ep = l->accept(kEventually);
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  Buffer plan = poisoned(MemSpec{}, 4096);
  ASSERT_TRUE(ep->recv(plan.region(), kAnyTag).wait(kEventually).ok());  // the client is up and talking
  Buffer d = poisoned(MemSpec{}, 64 << 20);
  Request pending = ep->recv(d.region(), 0x123456);  // nothing will ever match it
  ::kill(child, sig);
  auto t0 = Clock::now();
  Status s = pending.wait(bound + 10s);
  auto took = Clock::now() - t0;
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_EQ(s.code(), Code::kPeerFailed) << s.to_string();
  EXPECT_NE(s.to_string().find("127.0.0.1"), std::string::npos) << "the error must name the peer";
  EXPECT_LT(took, bound) << s.to_string();
}

// Noticed by the death itself, not by peer_timeout (60 s here).
TEST(PeerDeath, KilledPeerFailsPendingOperations) {
  Options o;
  o.set("peer_timeout", "60s");
  peer_dies(SIGKILL, o, kLoadSlack);
}

// peer_timeout long enough that the live peer, starved on a loaded machine, is not taken for dead.
TEST(PeerDeath, SilentPeerIsDetectedByTimeout) {
  Options o;
  o.set("keepalive_interval", "500ms").set("peer_timeout", "3s");
  peer_dies(SIGSTOP, o, 3s + kLoadSlack);
}

class Concurrency : public ::testing::TestWithParam<const char*> {};

TEST_P(Concurrency, ManyOperationsBothWaysAtOnce) {
  Options o = test_options();
  o.set("transport", GetParam());
  Pair p = connect_pair(o);
  constexpr int kOps = 60;
  std::vector<Filled> out_c, out_s;
  std::vector<Buffer> in_c, in_s;
  for (int i = 0; i < kOps; ++i) {
    size_t n = (i * 7919u) % (3 << 20) + i;  // eager and rendezvous sizes mixed
    out_c.push_back(filled(MemSpec{}, n));
    out_s.push_back(filled(MemSpec{}, n));
    in_c.push_back(poisoned(MemSpec{}, n));
    in_s.push_back(poisoned(MemSpec{}, n));
  }
  ASSERT_NO_FATAL_FAILURE(exchange_both_ways(p.client, p.server, out_c, out_s, in_c, in_s, 60s));
  EndpointStats st = p.client.stats();
  EXPECT_EQ(st.messages_sent, static_cast<uint64_t>(kOps));
  EXPECT_GT(st.eager_sends, 0u);
  EXPECT_GT(st.rendezvous_sends, 0u);
  if (st.transport == "tcp") {
    size_t used = 0;
    for (uint64_t b : st.stream_bytes_sent) used += b > 0;
    EXPECT_GT(used, 1u) << "large messages were not striped over several streams";
  } else {
    // Host memory goes by shm; with CUDA, cuda_ipc is agreed too (first) and carries none of it.
    uint64_t by_paths = 0;
    for (const auto& u : st.paths) by_paths += u.bytes_sent;
    ASSERT_FALSE(st.paths.empty());
    EXPECT_GT(by_paths, 0u) << "no payload path carried anything (" << st.transport << ")";
  }
}

// Many small frames posted back to back, so that one read of a stream takes several frames and
// cuts others anywhere: sizes around the stream's 4 KiB read-ahead (a header is 64 bytes, so a
// 4032-byte payload ends exactly at its end), zero bytes, and a few rendezvous messages whose
// payloads start inside the read-ahead and continue straight into their destinations.
TEST_P(Concurrency, SmallFramesBackToBackCrossTheReadAhead) {
  Options o = test_options(1);
  o.set("transport", GetParam());
  Pair p = connect_pair(o);
  const std::vector<size_t> sizes = {0, 1, 63, 64, 65, 4031, 4032, 4033, 4096, 4097, 8191, 100, 3, 20000, 70000};
  constexpr int kOps = 300;
  std::vector<Filled> out;
  std::vector<Buffer> in;
  std::vector<Request> sends, recvs;
  for (int i = 0; i < kOps; ++i) {
    size_t n = sizes[static_cast<size_t>(i) % sizes.size()];
    out.push_back(filled(MemSpec{}, n));
    in.push_back(poisoned(MemSpec{}, n));
  }
  for (int i = 0; i < kOps; ++i) sends.push_back(p.client.send(out[i].buf.region(), static_cast<uint64_t>(i)));
  for (int i = 0; i < kOps; ++i) recvs.push_back(p.server.recv(in[i].region(), static_cast<uint64_t>(i)));
  for (int i = 0; i < kOps; ++i) {
    ASSERT_TRUE(recvs[i].wait(kEventually).ok()) << i << ": " << recvs[i].status().to_string();
    ASSERT_TRUE(sends[i].wait(kEventually).ok()) << i;
    ASSERT_EQ(recvs[i].bytes(), out[i].data.size()) << i;
    ASSERT_EQ(read_back(in[i].region()), out[i].data) << "message " << i << " of " << out[i].data.size() << " B";
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, Concurrency, ::testing::Values("tcp", "auto"));

}  // namespace
// The transport setting names the registry's transports; any other name fails the context.
TEST(Lifecycle, UnknownTransportSettingListsTheChoices) {
  auto c = Context::create(test_options().set("transport", "carrier-pigeon"));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  EXPECT_NE(c.status().message().find("auto|cuda_ipc|devmem|rdma|shm|tcp"), std::string::npos) << c.status().to_string();
  EXPECT_FALSE(Context::create(test_options().set("transport", "shm_pipe")).ok()) << "not a payload transport";
  EXPECT_TRUE(Context::create(test_options().set("transport", "devmem")).ok());
}

// An idle endpoint's control stream sleeps until its next deadline or keepalive; an operation
// posted meanwhile with an earlier deadline wakes it, so the deadline does not wait for the
// keepalive (300 s here).
TEST(Lifecycle, DeadlinePostedOnAnIdleEndpointIsKept) {
  for (const char* transport : {"tcp", "auto"}) {
    Pair p = connect_pair(test_options(1).set("transport", transport).set("keepalive_interval", "300s").set("peer_timeout", "900s"));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // stream 0 goes to sleep
    std::vector<unsigned char> buf(16);
    auto t0 = Clock::now();
    Request r = p.server.recv(MemRegion{buf.data(), buf.size(), {}}, 7, OpOptions{.timeout = std::chrono::milliseconds(50)});
    Status st = r.wait(2 * kLoadSlack);
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    EXPECT_EQ(st.code(), Code::kTimeout) << transport << ": " << st.to_string();
    EXPECT_LT(took, 50 + std::chrono::milliseconds(kLoadSlack).count()) << transport << ": the deadline waited for the keepalive";
    std::printf("%s: a 50 ms deadline on an idle endpoint fired after %lld ms\n", transport, static_cast<long long>(took));
  }
}

}  // namespace dmx::test
