// The engine with the devmem payload path chosen at connection time, over the socket-pair double
// (tests/devmem/socket_double.h): each "host" is a Context with its own SimNic installed as the
// devmem transport's path factory (make_devmem_transport, ContextImpl::register_transport), so the data socket is a real
// loopback TCP connection made by the handshake (JOIN index = streams) and real bytes move through
// the double's fragments and tokens. The double's "device" memory is the sim kind (mapped with no
// access rights: engine code that touches it directly crashes). No devmem NIC is involved. Sends,
// chunking, stop, cancel, the path's memory and the negotiation here; one-sided operations in
// devmem_engine_one_sided_test.cc; the helpers in devmem_engine_util.h.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <thread>

#include "devmem/host_arenas.h"
#include "engine/devmem_engine_util.h"
#include "engine/handshake.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;
using namespace devmem_engine;
using devmem::testing::held;

TEST(DevmemEngineDouble, ForcedDevmemIsChosenAndVisible) {
  DevmemPair p = connect_devmem();
  for (Endpoint* e : {&p.client, &p.server}) {
    EndpointStats st = e->stats();
    EXPECT_EQ(st.transport, "devmem") << st.reason;
    EXPECT_NE(st.reason.find("transport=devmem"), std::string::npos) << st.reason;
    EXPECT_NE(st.reason.find("test double"), std::string::npos) << st.reason;
    ASSERT_EQ(st.paths.size(), 1u);
    EXPECT_EQ(st.paths[0].name, "devmem");
    EXPECT_FALSE(st.paths[0].detail.empty());
  }
}

TEST(DevmemEngineDouble, SendRecvSizesIntoSimAndHost) {
  DevmemPair p = connect_devmem();
  uint64_t big = 0;
  for (MemSpec dst_kind : {kSim, kHost}) {
    for (size_t n : {size_t{1}, size_t{4097}, size_t{(1u << 20) + 3}, size_t{(64u << 20) + 3}}) {
      Filled src = filled(kSim, n + 5);
      Buffer dst = poisoned(dst_kind, n + 11 + 16);
      Request r = p.server.recv(dst.region().sub(11, n), 42);
      Request s = p.client.send(src.buf.region().sub(5, n), 42);
      ASSERT_TRUE(s.wait(kEventually).ok()) << n << ": " << s.status().to_string();
      ASSERT_TRUE(r.wait(kEventually).ok()) << n << ": " << r.status().to_string();
      EXPECT_EQ(r.bytes(), n);
      auto got = read_back(dst.region());
      for (size_t i = 0; i < 11; ++i) ASSERT_EQ(got[i], 0xA5) << "wrote before the buffer at size " << n;
      ASSERT_TRUE(std::equal(src.data.begin() + 5, src.data.end(), got.begin() + 11))
          << "payload differs at size " << n << " into " << to_string(dst_kind);
      for (size_t i = 11 + n; i < got.size(); ++i) ASSERT_EQ(got[i], 0xA5) << "wrote past the message at size " << n;
      if (n > 16384) big += n;  // rendezvous sizes (above the eager limit) go by devmem
    }
  }
  EXPECT_GE(devmem_bytes_sent(p.client), big);
  EXPECT_GE(devmem_bytes_received(p.server), big);
}

// A path that takes a prefix of each chunk it may cut: the endpoint sends the rest in further
// chunks (sends and reads, odd sizes), every byte lands once and in place; eager messages, which
// must go whole, are never cut.
TEST(DevmemEngineDouble, PathTakingAPrefixGetsTheRestInFurtherChunks) {
  DevmemPair p = connect_devmem(Wrap::kPrefix);
  uint64_t chunks_before = 0;
  for (const auto& u : p.client.stats().paths) chunks_before += u.chunks_sent;
  size_t total = 0;
  for (size_t n : {size_t{8}, size_t{16384}, size_t{100004}, size_t{(1u << 20) + 3}, size_t{(5u << 20) + 1}}) {
    Filled src = filled(kSim, n + 5);
    Buffer dst = poisoned(kSim, n + 11 + 16);
    Request r = p.server.recv(dst.region().sub(11, n), 9);
    Request s = p.client.send(src.buf.region().sub(5, n), 9);
    ASSERT_TRUE(s.wait(kEventually).ok()) << n << ": " << s.status().to_string();
    ASSERT_TRUE(r.wait(kEventually).ok()) << n << ": " << r.status().to_string();
    EXPECT_EQ(r.bytes(), n);
    auto got = read_back(dst.region());
    for (size_t i = 0; i < 11; ++i) ASSERT_EQ(got[i], 0xA5) << n;
    ASSERT_TRUE(std::equal(src.data.begin() + 5, src.data.end(), got.begin() + 11)) << n;
    for (size_t i = 11 + n; i < got.size(); ++i) ASSERT_EQ(got[i], 0xA5) << n;
    if (n > 16384) total += n;
  }
  uint64_t chunks = 0;
  for (const auto& u : p.client.stats().paths) chunks += u.chunks_sent;
  // Every rendezvous byte in chunks of at most PrefixPath::kTake.
  EXPECT_GE(chunks - chunks_before, total / PrefixPath::kTake);
  EXPECT_GE(devmem_bytes_sent(p.client), total);

  size_t n = (2u << 20) + 9;
  Buffer target = poisoned(kSim, n);
  Filled data = filled(kSim, n);
  ASSERT_TRUE(copy_memory(target.region(), data.buf.region()).ok());
  auto reg = p.a.ctx.register_memory(target.region());
  ASSERT_TRUE(reg.ok());
  Buffer back = poisoned(kSim, n);
  ASSERT_TRUE(p.client.read(back.region(), reg->remote(), 0).wait(kEventually).ok());
  EXPECT_EQ(read_back(back.region()), data.data);
  for (const auto& u : p.server.stats().paths) EXPECT_NE(u.detail.find("chunks cut"), std::string::npos) << u.detail;
}

// The receiving endpoint offers a path chunk to the small-chunk lane (post_rx_now) only when nothing
// waits behind its header on the control stream (Stream::rx_backlog): in a strict ping-pong nothing
// does, and every chunk is offered. (The other half, a burst whose chunks are queued instead, needs
// chunk headers that arrive back to back, which the devmem double's rendezvous chunks do not: it is
// CudaIpcEngineGpu.SmallMessageBurstGoesToThePathsThread, with eager messages, on a GPU.)
TEST(DevmemEngineDouble, PingPongChunksAreOfferedToTheLane) {
  DevmemPair p = connect_devmem(Wrap::kLaneCounting);
  auto counts = [&](const Endpoint& e) {
    std::pair<uint64_t, uint64_t> c{0, 0};
    for (const auto& u : e.stats().paths) {
      auto at = u.detail.find("(lane offered ");
      if (at != std::string::npos)
        std::sscanf(u.detail.c_str() + at, "(lane offered %" SCNu64 ", queued %" SCNu64 ")", &c.first, &c.second);
    }
    return c;
  };
  const size_t n = 20000;  // above the eager limit: one devmem chunk each
  constexpr int kRounds = 40;
  Filled src = filled(kSim, n);
  Buffer dst = poisoned(kSim, n);
  for (int i = 0; i < kRounds; ++i) {  // strict ping-pong: the reply waits for the message
    Request r = p.server.recv(dst.region(), 1);
    ASSERT_TRUE(p.client.send(src.buf.region(), 1).wait(kEventually).ok());
    ASSERT_TRUE(r.wait(kEventually).ok());
    // Two bytes: a send's buffer is dmx's until it completes (eager sends go from it), so the
    // reply must not land in the byte being sent.
    unsigned char ack = 1, got = 0;
    Request back = p.client.recv(MemRegion{&got, 1, {}}, 2);
    ASSERT_TRUE(p.server.send(MemRegion{&ack, 1, {}}, 2).wait(kEventually).ok());
    ASSERT_TRUE(back.wait(kEventually).ok());
  }
  auto [now_pp, queued_pp] = counts(p.server);
  EXPECT_EQ(now_pp + queued_pp, static_cast<uint64_t>(kRounds));
  EXPECT_GE(now_pp, static_cast<uint64_t>(kRounds) * 9 / 10) << "ping-pong chunks queued: " << queued_pp;
}

// Defect 8: a path that never stops used to keep its endpoint's last worker (and close()) waiting
// forever; close() now returns at stop_timeout with an error naming the path.
TEST(DevmemEngineDouble, PathThatDoesNotStopEndsCloseAtItsDeadline) {
  Options o = devmem_options();
  o.set("stop_timeout", "300ms");
  DevmemPair p = connect_devmem(Wrap::kStuckStop, o);
  Filled src = filled(kSim, 1 << 20);
  Buffer dst = poisoned(kSim, 1 << 20);
  Request r = p.server.recv(dst.region(), 3);
  Request s = p.client.send(src.buf.region(), 3);
  ASSERT_TRUE(s.wait(kEventually).ok()) << s.status().to_string();
  ASSERT_TRUE(r.wait(kEventually).ok()) << r.status().to_string();
  ASSERT_GT(devmem_bytes_sent(p.client), 0u);  // the path was in use
  auto t0 = std::chrono::steady_clock::now();
  Status c = p.client.close();
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(c.code(), Code::kTimeout) << c.to_string();
  EXPECT_NE(c.message().find("payload path devmem did not stop within 300 ms"), std::string::npos) << c.to_string();
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 300ms + kLoadSlack);
  // The endpoint is unusable, and says so.
  EXPECT_FALSE(p.client.health().ok());
  // The server's path is stuck as well: its close ends the same way.
  Status sv = p.server.close();
  EXPECT_EQ(sv.code(), Code::kTimeout) << sv.to_string();
  // Destroying the endpoints stops the real paths and joins their threads.
}

TEST(DevmemEngineDouble, CancelMidway) {
  DevmemPair p = connect_devmem();
  size_t n = 256u << 20;
  Buffer src = poisoned(kSim, n);
  Buffer dst = poisoned(kSim, n);
  Request r = p.server.recv(dst.region(), 1);
  Request s = p.client.send(src.region(), 1);
  std::this_thread::sleep_for(20ms);
  s.cancel();
  Status ss = s.wait(kEventually);
  ASSERT_NE(ss.code(), Code::kTimeout);
  if (ss.ok()) {
    EXPECT_TRUE(r.wait(kEventually).ok()) << r.status().to_string();
  } else {  // a cancel before any byte went (a slow machine) puts the receive back
    EXPECT_EQ(ss.code(), Code::kCancelled) << ss.to_string();
    ASSERT_NO_FATAL_FAILURE(expect_cancelled_or_put_back(p.client, p.server, r, dst.region(), 1, kSim));
  }
  // The endpoint and its data socket carry on, in order.
  Filled m = filled(kSim, 5 << 20);
  Request r2 = p.server.recv(dst.region(), 2);
  ASSERT_TRUE(p.client.send(m.buf.region(), 2).wait(kEventually).ok());
  ASSERT_TRUE(r2.wait(kEventually).ok()) << r2.status().to_string();
  EXPECT_EQ(read_back(dst.region().sub(0, 5 << 20)), m.data);
}

TEST(DevmemEngineDouble, ManyOperationsBothWaysAtOnce) {
  DevmemPair p = connect_devmem();
  constexpr int kOps = 40;
  std::vector<Filled> out_c, out_s;
  std::vector<Buffer> in_c, in_s;
  for (int i = 0; i < kOps; ++i) {
    size_t n = (i * 7919u) % (3 << 20) + i + 1;
    out_c.push_back(filled(kSim, n));
    out_s.push_back(filled(i % 3 == 0 ? kHost : kSim, n));
    in_c.push_back(poisoned(i % 2 ? kHost : kSim, n));
    in_s.push_back(poisoned(i % 2 ? kSim : kHost, n));
  }
  ASSERT_NO_FATAL_FAILURE(exchange_both_ways(p.client, p.server, out_c, out_s, in_c, in_s, 120s));
  EXPECT_GT(devmem_bytes_sent(p.client), 0u);
  EXPECT_GT(devmem_bytes_sent(p.server), 0u);
}

TEST(DevmemEngineDouble, PeerContextDestroyedMidTransfer) {
  DevmemPair p = connect_devmem();
  size_t n = 256u << 20;
  Buffer src = poisoned(kSim, n);
  Buffer dst = poisoned(kSim, n);
  Buffer small = poisoned(kSim, 4096);
  Request r = p.server.recv(dst.region(), 1);
  Request s = p.client.send(src.region(), 1);
  Request pending = p.client.recv(small.region(), 77);  // never sent: must fail, not hang
  std::this_thread::sleep_for(20ms);
  std::string peer = p.listener.address().substr(6);  // the client names the server by its address
  auto t0 = Clock::now();
  p.server = Endpoint();
  p.listener = Listener();
  p.a.ctx = Context();
  for (Request* q : {&s, &pending}) {
    Status st = q->wait(kEventually);
    ASSERT_NE(st.code(), Code::kTimeout) << "a pending operation hung after the peer went away";
    if (q == &s && st.ok()) continue;  // finished before the peer went
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.to_string().find(peer), std::string::npos) << "the error must name the peer: " << st.to_string();
  }
  EXPECT_LT(Clock::now() - t0, kEventually);
  (void)r.wait(1s);
}

// The path's RX pool and TX ring come from the machine's placement (the GPU pool nearest the NIC,
// here ens1 of the fixture, and cuda:0; the 64 MiB pool grows by an extent for the ring), booked
// to the NIC and peer while the path lives, and go back when the endpoint closes. The bytes still
// move by devmem, through that memory.
TEST(DevmemEngineDouble, PathMemoryComesFromThePlacementAndGoesBackAtClose) {
  devmem::testing::HostArenas arenas_a, arenas_b;
  auto pa = arenas_a.machine(), pb = arenas_b.machine();
  SimNicOptions no;
  no.ifname = "ens1";
  {
    DevmemPair p = connect_devmem(Wrap::kNone, devmem_options(), no, pa, pb);
    ASSERT_TRUE(p.client.valid() && p.server.valid());
    for (const auto* m : {pa.get(), pb.get()}) {
      EXPECT_EQ(held(*m, "devmem RX pool of ens1"), 32u << 20);  // devmem_rx_pool
      EXPECT_EQ(held(*m, "devmem TX ring of ens1 to "), 64u << 20);
    }
    bool extent = false;
    for (const auto& u : pa->usage()) extent = extent || u.desc.name == "cuda:0 (0000:03:00.0) extent 1";
    EXPECT_TRUE(extent) << "the TX ring did not fit beside the RX pool: the pool grows";
    std::string detail = devmem_detail(p.server);
    EXPECT_NE(detail.find("32 MiB pool (binding 7) from GPU pool cuda:0 (0000:03:00.0)"), std::string::npos) << detail;
    EXPECT_NE(detail.find("TX ring (binding 8) from GPU pool cuda:0 (0000:03:00.0) extent 1"), std::string::npos)
        << detail;
    size_t n = (5u << 20) + 3;
    Filled src = filled(kSim, n);
    Buffer dst = poisoned(kSim, n);
    Request r = p.server.recv(dst.region(), 4);
    ASSERT_TRUE(p.client.send(src.buf.region(), 4).wait(kEventually).ok());
    ASSERT_TRUE(r.wait(kEventually).ok()) << r.status().to_string();
    EXPECT_EQ(read_back(dst.region()), src.data);
    EXPECT_GE(devmem_bytes_received(p.server), n);
    EXPECT_TRUE(p.client.close().ok());
    EXPECT_TRUE(p.server.close().ok());
  }
  // The paths are gone with their endpoints: every booking and the extents' memory went back.
  auto deadline = Clock::now() + kEventually;
  while ((held(*pa, "devmem") != 0 || held(*pb, "devmem") != 0) && Clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(held(*pa, "devmem"), 0u);
  EXPECT_EQ(held(*pb, "devmem"), 0u);
  EXPECT_EQ(arenas_a.freed.load(), arenas_a.allocated.load() - 1) << "all but the pool's own arena";
  for (const auto& u : pa->usage()) EXPECT_EQ(u.desc.name.find("extent"), std::string::npos) << u.desc.name;
}

// Without the double, devmem is offered only where devmem_path_offer says so; on this machine
// (devmem_ifname empty) transport=devmem fails with that reason.
TEST(DevmemEngine, ForcedDevmemWithoutNicFailsWithTheReason) {
  auto server = Context::create(test_options(2));
  ASSERT_TRUE(server.ok());
  auto l = server->listen("tcp://127.0.0.1:0");
  ASSERT_TRUE(l.ok());
  Options o = test_options(2);
  o.set("transport", "devmem");
  auto client = Context::create(o);
  ASSERT_TRUE(client.ok());
  auto c = client->connect(l->address());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kUnavailable) << c.status().to_string();
  EXPECT_NE(c.status().message().find("devmem_ifname is empty"), std::string::npos) << c.status().to_string();

  // A server forced to devmem refuses such a client. Its reason (its setting, its NIC) stays in its
  // log: the REJECT goes to a peer that has not authenticated (docs/wire.md).
  auto forced = Context::create(o);
  ASSERT_TRUE(forced.ok());
  auto l2 = forced->listen("tcp://127.0.0.1:0");
  ASSERT_TRUE(l2.ok());
  auto plain = Context::create(test_options(2));
  auto c2 = plain->connect(l2->address());
  ASSERT_FALSE(c2.ok());
  EXPECT_EQ(c2.status().code(), Code::kUnavailable) << c2.status().to_string();
  EXPECT_NE(c2.status().message().find("no data path in common"), std::string::npos) << c2.status().to_string();
  EXPECT_EQ(c2.status().message().find("transport=devmem"), std::string::npos)
      << "the server's setting was told: " << c2.status().to_string();
}

// Same host (one process): auto does not pick devmem even when both offer it; the server says why.
TEST(DevmemEngineDouble, AutoOnOneHostDoesNotPickDevmem) {
  Host a = make_host(1, devmem_options("auto")), b = make_host(2, devmem_options("auto"));
  auto l = a.ctx.listen("tcp://127.0.0.1:0");
  ASSERT_TRUE(l.ok());
  auto c = b.ctx.connect(l->address());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EndpointStats st = c->stats();
  EXPECT_NE(st.transport, "devmem") << st.reason;
  EXPECT_NE(st.reason.find("the server did not accept devmem"), std::string::npos) << st.reason;
}

// The rule itself, from two HELLOs (different hosts cannot be made in one process otherwise).
TEST(DevmemEngine, NegotiateRule) {
  auto ctx = Context::create(test_options(2));
  ASSERT_TRUE(ctx.ok());
  const ContextImpl& impl = *ctx->impl();
  wire::Hello client = make_hello(impl, wire::Role::kClient);
  wire::Hello server = make_hello(impl, wire::Role::kServer);
  server.boot_id = "another-host-boot-id";
  client.offers = {wire::Offer{"devmem", {1, 0}}};
  server.offers = client.offers;
  auto s = negotiate(impl, client, server, "peer:1", "");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->transport, "devmem");
  ASSERT_EQ(s->agreed.size(), 1u);
  EXPECT_EQ(s->agreed[0]->name(), "devmem");
  EXPECT_EQ(s->streams, 1) << "a payload path needs only the control stream";
  EXPECT_NE(s->reason.find("different hosts"), std::string::npos) << s->reason;

  client.offers.push_back(wire::Offer{"tcp", {1}});
  server.offers = {wire::Offer{"tcp", {1}}};
  s = negotiate(impl, client, server, "peer:1", "devmem: off (setting devmem_ifname is empty)");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->transport, "tcp");
  EXPECT_EQ(s->streams, wire::stream_sockets(server.streams)) << "the data streams and the control stream";
  EXPECT_NE(s->reason.find(fmt::format("different hosts; every chunk inline on the TCP streams ({} data streams) "
                                       "(devmem: off (setting devmem_ifname is empty))",
                                       server.streams)),
            std::string::npos)
      << s->reason;

  server.offers.clear();
  s = negotiate(impl, client, server, "peer:1", "");
  ASSERT_FALSE(s.ok()) << "nothing that carries payload was agreed";
  EXPECT_NE(s.status().message().find("no transport that carries payload"), std::string::npos)
      << s.status().to_string();

  // A server listing what the client never offered is refused, as is a descriptor this side
  // finds incompatible (a server on one host that dropped nothing).
  server.offers = {wire::Offer{"shm", {1}}};
  s = negotiate(impl, client, server, "peer:1", "");
  EXPECT_EQ(s.status().code(), Code::kProtocol) << s.status().to_string();
  server.offers = client.offers;
  server.boot_id = client.boot_id;
  s = negotiate(impl, client, server, "peer:1", "");
  EXPECT_EQ(s.status().code(), Code::kProtocol) << s.status().to_string();
  EXPECT_NE(s.status().message().find("both ends are on one host"), std::string::npos) << s.status().to_string();

  // The server drops devmem for a same-host client unless a side is forced to devmem.
  wire::Hello same = make_hello(impl, wire::Role::kServer);
  same.offers = {wire::Offer{"devmem", {1, 0}}};
  SideChannels channels;
  std::string why;
  wire::Hello c2 = make_hello(impl, wire::Role::kClient);
  c2.offers = {wire::Offer{"devmem", {1, 0}}};
  accept_transports(impl, c2, &same, &channels, &why);
  EXPECT_EQ(same.offer("devmem"), nullptr);
  EXPECT_NE(why.find("both ends are on one host"), std::string::npos) << why;
  c2.offers = {wire::Offer{"devmem", {1, 1}}};  // the client is forced: both sides agree devmem
  same.offers = {wire::Offer{"devmem", {1, 0}}};
  accept_transports(impl, c2, &same, &channels, &why);
  EXPECT_NE(same.offer("devmem"), nullptr);
}

}  // namespace
}  // namespace dmx::test
