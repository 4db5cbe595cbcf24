// Several links (Session::multilink, endpoint/links.cc) over loopback: a data stream cut
// mid-transfer (its socket shut down, as a dead link ends it) moves its chunks to the other
// streams, every byte arriving once; with every data stream cut the operations fail with the
// reason. tests/netns/multilink.sh does the same with real links between namespaces.
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "client_sockets.h"
#include "engine/table_util.h"
#include "test_util.h"

namespace dmx {
namespace {

using test::client_sockets;
using test::filled;
using test::poisoned;
using test::port_of;
using test::read_back;

Options multilink_options() { return test::test_options(4).set("multilink", "on").set("transport", "tcp"); }

// Waits until the client has sent `bytes` of payload (the transfer is under way).
void wait_sent(const Endpoint& ep, uint64_t bytes) {
  auto until = std::chrono::steady_clock::now() + test::kEventually;
  while (ep.stats().bytes_sent < bytes && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST(Multilink, ADataStreamCutMidTransferLosesNoByte) {
  test::Pair p = test::connect_pair(multilink_options());
  std::vector<int> fds = client_sockets(port_of(p.listener.address()));
  ASSERT_EQ(fds.size(), 5u) << "stream 0 and 4 data streams";
  const size_t n = (96 << 20) + 12345;
  auto out_c = filled(MemSpec{}, n), out_s = filled(MemSpec{}, n);
  Buffer in_s = poisoned(MemSpec{}, n), in_c = poisoned(MemSpec{}, n);
  Request r1 = p.server.recv(in_s.region(), 1), r2 = p.client.recv(in_c.region(), 2);
  Request s1 = p.client.send(out_c.buf.region(), 1), s2 = p.server.send(out_s.buf.region(), 2);
  wait_sent(p.client, 8 << 20);
  ::shutdown(fds[2], SHUT_RDWR);  // data stream 2, both directions, mid-transfer
  for (Request* r : {&r1, &r2, &s1, &s2}) ASSERT_TRUE(r->wait(test::kEventually).ok()) << r->status().to_string();
  EXPECT_EQ(read_back(in_s.region()), out_c.data);
  EXPECT_EQ(read_back(in_c.region()), out_s.data);
  // The endpoint goes on over the other three.
  auto more = filled(MemSpec{}, (8 << 20) + 1);
  Buffer more_in = poisoned(MemSpec{}, more.data.size());
  Request r3 = p.server.recv(more_in.region(), 3);
  Request s3 = p.client.send(more.buf.region(), 3);
  ASSERT_TRUE(s3.wait(test::kEventually).ok()) << s3.status().to_string();
  ASSERT_TRUE(r3.wait(test::kEventually).ok()) << r3.status().to_string();
  EXPECT_EQ(read_back(more_in.region()), more.data);
  EXPECT_TRUE(p.client.health().ok()) << p.client.health().to_string();
}

TEST(Multilink, AWriteAndAReadSurviveACutToo) {
  test::Pair p = test::connect_pair(multilink_options());
  std::vector<int> fds = client_sockets(port_of(p.listener.address()));
  ASSERT_EQ(fds.size(), 5u);
  const size_t n = (64 << 20) + 777;
  auto target = filled(MemSpec{}, 2 * n);
  auto reg = p.ctx.register_memory(target.buf.region());
  ASSERT_TRUE(reg.ok()) << reg.status().to_string();
  auto src = filled(MemSpec{}, n);
  Buffer dst = poisoned(MemSpec{}, n);
  Request w = p.client.write(src.buf.region(), reg->remote(), 0);
  Request rd = p.client.read(dst.region(), reg->remote(), n);
  wait_sent(p.client, 4 << 20);
  ::shutdown(fds[3], SHUT_RDWR);
  ASSERT_TRUE(w.wait(test::kEventually).ok()) << w.status().to_string();
  ASSERT_TRUE(rd.wait(test::kEventually).ok()) << rd.status().to_string();
  std::vector<unsigned char> landed = read_back(target.buf.region().sub(0, n));
  EXPECT_EQ(landed, src.data);
  std::vector<unsigned char> expect(target.data.begin() + static_cast<long>(n), target.data.end());
  EXPECT_EQ(read_back(dst.region()), expect);
}

// A vectored write of many small blocks goes as inline tables (docs/wire.md "Tables"); a data
// stream cut mid-write: the tables it had not landed go again by the other streams, each block
// landing once, and the one notification comes after the last.
TEST(Multilink, AVectoredWriteOfSmallBlocksSurvivesACut) {
  test::Pair p = test::connect_pair(multilink_options());
  std::vector<int> fds = client_sockets(port_of(p.listener.address()));
  ASSERT_EQ(fds.size(), 5u);
  std::mt19937_64 rng(std::random_device{}());
  test::Layout l = test::make_layout(test::random_sizes(100000, 1, 4000), 3, rng);
  auto src = filled(MemSpec{}, l.local_size);
  std::vector<Buffer> targets;
  std::vector<Registration> regs;
  std::vector<RemoteRegion> remote;
  for (uint64_t size : l.region_size) {
    targets.push_back(poisoned(MemSpec{}, size));
    auto reg = p.ctx.register_memory(targets.back().region());
    ASSERT_TRUE(reg.ok()) << reg.status().to_string();
    remote.push_back(reg->remote());
    regs.push_back(std::move(*reg));
  }
  uint64_t before = p.server.stats().bytes_received;
  OpOptions o;
  o.notify = true;
  o.notify_value = 7;
  MemRegion local[] = {src.buf.region()};
  Request w = p.client.write_vec(local, remote, l.entries, o);
  wait_sent(p.client, l.total / 8);
  ::shutdown(fds[2], SHUT_RDWR);
  uint64_t sent_at_cut = p.client.stats().bytes_sent;
  ASSERT_TRUE(w.wait(test::kEventually).ok()) << w.status().to_string();
  auto note = p.server.next_notification(test::kEventually);
  ASSERT_TRUE(note.ok()) << note.status().to_string();
  EXPECT_EQ(note->value, 7u);
  std::vector<std::vector<unsigned char>> got;
  for (const Buffer& b : targets) got.push_back(read_back(b.region()));
  test::expect_landed(l, src.data, got);
  EXPECT_LT(sent_at_cut, l.total) << "the cut came after the write";
  EXPECT_GE(p.server.stats().bytes_received - before, l.total + 100000 * wire::kTableEntrySize)
      << "the blocks did not come as inline tables";
  EXPECT_FALSE(p.server.next_notification(std::chrono::milliseconds(50)).ok()) << "a second notification";
}

// The same for a vectored read: the target's reply goes as inline read tables (version 12); a
// data stream cut mid-reply: the tables it had not landed go again by the other streams.
TEST(Multilink, AVectoredReadOfSmallBlocksSurvivesACut) {
  test::Pair p = test::connect_pair(multilink_options());
  std::vector<int> fds = client_sockets(port_of(p.listener.address()));
  ASSERT_EQ(fds.size(), 5u);
  std::mt19937_64 rng(std::random_device{}());
  test::Layout l = test::make_layout(test::random_sizes(100000, 1, 4000), 3, rng);
  std::vector<test::Filled> sources;
  std::vector<Registration> regs;
  std::vector<RemoteRegion> remote;
  for (uint64_t size : l.region_size) {
    sources.push_back(filled(MemSpec{}, size));
    auto reg = p.ctx.register_memory(sources.back().buf.region());
    ASSERT_TRUE(reg.ok()) << reg.status().to_string();
    remote.push_back(reg->remote());
    regs.push_back(std::move(*reg));
  }
  Buffer dst = poisoned(MemSpec{}, l.local_size);
  uint64_t before = p.client.stats().bytes_received;
  MemRegion local[] = {dst.region()};
  Request r = p.client.read_vec(local, remote, l.entries);
  auto until = std::chrono::steady_clock::now() + test::kEventually;
  while (p.client.stats().bytes_received - before < l.total / 8 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ::shutdown(fds[2], SHUT_RDWR);
  uint64_t received_at_cut = p.client.stats().bytes_received - before;
  ASSERT_TRUE(r.wait(test::kEventually).ok()) << r.status().to_string();
  ASSERT_NO_FATAL_FAILURE(test::expect_read_landed(l, sources, read_back(dst.region())));
  EXPECT_LT(received_at_cut, l.total) << "the cut came after the read";
  EXPECT_GE(p.client.stats().bytes_received - before, l.total + 100000 * wire::kTableEntrySize)
      << "the blocks did not come as inline tables";
  EXPECT_TRUE(p.client.health().ok()) << p.client.health().to_string();
}

// Small messages both ways (eager, so their bytes ride the control stream), big ones beside them,
// a write and a read: the control stream is cut (`cuts` sockets, one after another) while they are
// under way. Each must arrive once, byte-exact, in order per tag.
void control_cut(const std::vector<size_t>& cuts) {
  test::Pair p = test::connect_pair(multilink_options());
  std::vector<int> fds = client_sockets(port_of(p.listener.address()));
  ASSERT_EQ(fds.size(), 5u) << "stream 0 and 4 data streams";
  const size_t n = (64 << 20) + 4321;
  auto big_c = filled(MemSpec{}, n), big_s = filled(MemSpec{}, n);
  Buffer in_s = poisoned(MemSpec{}, n), in_c = poisoned(MemSpec{}, n);
  auto target = filled(MemSpec{}, 2 * n);
  auto reg = p.ctx.register_memory(target.buf.region());
  ASSERT_TRUE(reg.ok()) << reg.status().to_string();
  auto wsrc = filled(MemSpec{}, n);
  Buffer rdst = poisoned(MemSpec{}, n);
  constexpr int kSmall = 400;
  std::vector<test::Filled> small_c, small_s;
  std::vector<Buffer> small_in_s, small_in_c;
  std::vector<Request> reqs;
  for (int i = 0; i < kSmall; ++i) {
    small_c.push_back(filled(MemSpec{}, 1 + (i * 37) % 2000));
    small_s.push_back(filled(MemSpec{}, 1 + (i * 53) % 2000));
    small_in_s.push_back(poisoned(MemSpec{}, small_c.back().data.size()));
    small_in_c.push_back(poisoned(MemSpec{}, small_s.back().data.size()));
  }
  reqs.push_back(p.server.recv(in_s.region(), 1));
  reqs.push_back(p.client.recv(in_c.region(), 2));
  for (int i = 0; i < kSmall; ++i) {
    reqs.push_back(p.server.recv(small_in_s[i].region(), 10));
    reqs.push_back(p.client.recv(small_in_c[i].region(), 11));
  }
  reqs.push_back(p.client.send(big_c.buf.region(), 1));
  reqs.push_back(p.server.send(big_s.buf.region(), 2));
  reqs.push_back(p.client.write(wsrc.buf.region(), reg->remote(), 0));
  reqs.push_back(p.client.read(rdst.region(), reg->remote(), n));
  std::thread cutter([&] {
    wait_sent(p.client, 4 << 20);
    for (size_t c : cuts) {
      ::shutdown(fds[c], SHUT_RDWR);
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
  });
  for (int i = 0; i < kSmall; ++i) {  // while the cut happens: some before it, some after
    reqs.push_back(p.client.send(small_c[i].buf.region(), 10));
    reqs.push_back(p.server.send(small_s[i].buf.region(), 11));
    if (i % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  cutter.join();
  for (Request& r : reqs) ASSERT_TRUE(r.wait(test::kEventually).ok()) << r.status().to_string();
  EXPECT_EQ(read_back(in_s.region()), big_c.data);
  EXPECT_EQ(read_back(in_c.region()), big_s.data);
  for (int i = 0; i < kSmall; ++i) {
    ASSERT_EQ(read_back(small_in_s[i].region()), small_c[i].data) << "message " << i;
    ASSERT_EQ(read_back(small_in_c[i].region()), small_s[i].data) << "message " << i;
  }
  EXPECT_EQ(read_back(target.buf.region().sub(0, n)), wsrc.data);
  std::vector<unsigned char> expect(target.data.begin() + static_cast<long>(n), target.data.end());
  EXPECT_EQ(read_back(rdst.region()), expect);
  // The endpoint goes on: a message each way, then an orderly close.
  auto more = filled(MemSpec{}, (4 << 20) + 3), back = filled(MemSpec{}, 100);
  Buffer more_in = poisoned(MemSpec{}, more.data.size()), back_in = poisoned(MemSpec{}, 100);
  Request r3 = p.server.recv(more_in.region(), 3), r4 = p.client.recv(back_in.region(), 4);
  Request s3 = p.client.send(more.buf.region(), 3), s4 = p.server.send(back.buf.region(), 4);
  for (Request* r : {&r3, &r4, &s3, &s4}) ASSERT_TRUE(r->wait(test::kEventually).ok()) << r->status().to_string();
  EXPECT_EQ(read_back(more_in.region()), more.data);
  EXPECT_EQ(read_back(back_in.region()), back.data);
  EXPECT_TRUE(p.client.health().ok()) << p.client.health().to_string();
  EXPECT_TRUE(p.server.health().ok()) << p.server.health().to_string();
}

TEST(Multilink, TheControlStreamCutMidTransferMovesAndLosesNothing) { control_cut({0}); }

TEST(Multilink, TheControlStreamMovesTwice) { control_cut({0, 1}); }

TEST(Multilink, EveryDataStreamCutFailsTheOperationsWithTheReason) {
  test::Pair p = test::connect_pair(multilink_options());
  std::vector<int> fds = client_sockets(port_of(p.listener.address()));
  ASSERT_EQ(fds.size(), 5u);
  const size_t n = 256 << 20;
  auto out = filled(MemSpec{}, n);
  Buffer in = poisoned(MemSpec{}, n);
  Request r = p.server.recv(in.region(), 1);
  Request s = p.client.send(out.buf.region(), 1);
  wait_sent(p.client, 4 << 20);
  for (size_t i = 1; i < fds.size(); ++i) ::shutdown(fds[i], SHUT_RDWR);
  Status ss = s.wait(test::kEventually), rs = r.wait(test::kEventually);
  if (ss.ok() && rs.ok()) GTEST_SKIP() << "the transfer finished before the cut (a very fast machine)";
  EXPECT_EQ(ss.code(), Code::kPeerFailed) << ss.to_string();
  // This side's last data stream, or the peer's end of the endpoint, whichever is noticed first.
  EXPECT_TRUE(ss.to_string().find("no link to the peer is left") != std::string::npos ||
              ss.to_string().find("lost the peer") != std::string::npos)
      << ss.to_string();
  EXPECT_NE(ss.to_string().find("127.0.0.1"), std::string::npos) << "names the peer: " << ss.to_string();
}

}  // namespace
}  // namespace dmx

namespace dmx {
namespace {

// A peer whose process no longer runs (its only stream worker held up for 8 s, as SIGSTOP would
// hold it) fails this side's pending operations within busy_peer_timeout (1.5 s here; off by
// default), not at peer_timeout (10 s); idle, it would have 10 s. The bound asserted is generous (a loaded
// machine); tests/netns/multilink.sh and scripts/multinic-bench.sh measure.
TEST(DeadPeer, AFrozenPeerFailsPendingOperationsWithinTheBusyTimeout) {
  auto sctx = Context::create(test::test_options(1).set("transport", "tcp").set("stream_workers", "1"));
  auto cctx = Context::create(test::test_options(1).set("transport", "tcp").set("busy_peer_timeout", "1500ms"));
  ASSERT_TRUE(sctx.ok() && cctx.ok());
  auto l = sctx->listen("tcp://127.0.0.1:0");
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  auto c = cctx->connect(l->address());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto s = l->accept(test::kEventually);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  auto msg = filled(MemSpec{}, 64);
  Buffer in = poisoned(MemSpec{}, 64);
  OpOptions freeze;
  freeze.on_complete = [](const Status&, size_t) { std::this_thread::sleep_for(std::chrono::seconds(8)); };
  Request sr = s->recv(in.region(), 9, freeze);
  ASSERT_TRUE(c->send(msg.buf.region(), 9).wait(test::kEventually).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the server's worker is in the callback
  Buffer never = poisoned(MemSpec{}, 64);
  auto t0 = std::chrono::steady_clock::now();
  Request r = c->recv(never.region(), 5);
  Status st = r.wait(std::chrono::seconds(30));
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  EXPECT_EQ(st.code(), Code::kPeerFailed) << st.to_string();
  EXPECT_NE(st.to_string().find("busy_peer_timeout"), std::string::npos) << st.to_string();
  EXPECT_NE(st.to_string().find(l->address().substr(6)), std::string::npos) << "names the peer: " << st.to_string();
  EXPECT_LT(took.count(), 7000) << "noticed before the peer woke (8 s), long before peer_timeout (10 s)";
  std::printf("frozen peer noticed after %lld ms: %s\n", static_cast<long long>(took.count()), st.to_string().c_str());
  (void)sr.wait(test::kEventually);  // the frozen peer's send ends either way
}

}  // namespace
}  // namespace dmx
