// The dispatcher's dmx face: clients that are dmx endpoints (two-sided), and the Remote MQueue
// Manager (a worker's ring lent to one client, written by one-sided writes with notifications).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <random>

#include "mqueue/remote_queue.h"
#include "mqueue_test_util.h"

namespace dmx::mqueue {
namespace {

using testing::Events;
using testing::eventually;

constexpr const char* kKey = "lynx-test-key-0123456789";

Options client_options(const char* key = kKey) {
  Options o;
  o.set("auth_key", key).set("streams", "1").set("log_level", "error");
  return o;
}

// Host workers: `local` for UDP/TCP/two-sided dmx, then `remote` remote rings.
ServerConfig dmx_config(Events& ev, uint32_t local, uint32_t remote, uint32_t slots = 16) {
  ServerConfig c = testing::host_config(ev, local + remote, slots, 4096);
  c.dispatch.dmx = "tcp://127.0.0.1:0";
  c.dispatch.dmx_options = client_options();
  c.dispatch.remote_queues = remote;
  return c;
}

std::vector<uint8_t> random_bytes(size_t n) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

bool is_xor_of(const std::vector<uint8_t>& got, const std::vector<uint8_t>& sent) {
  if (got.size() != sent.size()) return false;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != (sent[i] ^ kXorKey)) return false;
  return true;
}

LoadConfig dmx_load(const std::string& address, LoadConfig::Face face, uint32_t clients, uint64_t requests) {
  LoadConfig l;
  l.address = address;
  l.face = face;
  l.dmx_options = client_options();
  l.clients = clients;
  l.requests = requests;
  l.sizes = {0, 1, 7, 63, 64, 1000, 4096};
  l.seed = std::random_device{}();
  l.timeout = std::chrono::seconds(20);
  return l;
}

TEST(LynxDmx, TwoSidedRequestsAreAnsweredByteExact) {
  Events ev;
  auto server = Server::start(dmx_config(ev, 2, 0));
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  Dispatcher& d = (*server)->dispatcher();
  ASSERT_NE(d.dmx_address(), "");
  auto r = run_load(dmx_load(d.dmx_address(), LoadConfig::Face::kDmx, 3, 700));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->ok, 700u) << r->first_error << "\n" << ev.all();
  ASSERT_TRUE((*server)->stop().ok());
  EXPECT_EQ(d.stats().requests, 700u);
  EXPECT_EQ(d.stats().dmx_clients, 3u);
}

TEST(LynxDmx, AClientWithTheWrongKeyIsNotServed) {
  Events ev;
  auto server = Server::start(dmx_config(ev, 1, 0));
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  auto ctx = Context::create(client_options("not-the-servers-key-9876543210").set("connect_timeout", "3s"));
  ASSERT_TRUE(ctx.ok());
  auto c = DmxRequester::connect(*ctx, (*server)->dispatcher().dmx_address(), 64);
  EXPECT_FALSE(c.ok());
  EXPECT_EQ((*server)->dispatcher().stats().dmx_clients, 0u);
}

// Each hostile client is closed with a line naming it and what it did; an honest one goes on.
TEST(LynxDmx, HostileMessagesCloseOnlyTheirClient) {
  Events ev;
  auto server = Server::start(dmx_config(ev, 1, 0));
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  Dispatcher& d = (*server)->dispatcher();
  auto ctx = Context::create(client_options());
  ASSERT_TRUE(ctx.ok());
  auto honest = DmxRequester::connect(*ctx, d.dmx_address(), 4096);
  ASSERT_TRUE(honest.ok()) << honest.status().to_string();

  struct Case {
    std::vector<uint8_t> msg;
    const char* why;
  };
  auto framed = [](uint32_t magic, uint32_t len, size_t actual) {
    std::vector<uint8_t> m = random_bytes(sizeof(WireHeader) + actual);
    WireHeader h{magic, len, 7};
    std::memcpy(m.data(), &h, sizeof h);
    return m;
  };
  std::vector<Case> cases = {{framed(0x12345678, 10, 10), "bad magic"},
                             {framed(kRequestMagic, 10, 30), "header says 10 B"},
                             {framed(kRequestMagic, 5000, 5000), "max_request"},
                             {random_bytes(5), "short"}};
  for (const Case& k : cases) {
    auto ep = ctx->connect(d.dmx_address());
    ASSERT_TRUE(ep.ok()) << ep.status().to_string();
    const std::string me = ep->stats().peer;  // not the server's view; the server names us by its view
    (void)ep->send(MemRegion{const_cast<uint8_t*>(k.msg.data()), k.msg.size()}, 1).wait(std::chrono::seconds(20));
    EXPECT_TRUE(eventually([&] { return !ep->health().ok(); })) << k.why;
    EXPECT_TRUE(eventually([&] { return ev.any_contains("dropped dmx client", k.why); })) << k.why << "\n" << ev.all();
    auto req = random_bytes(333);
    ASSERT_TRUE((*honest)->submit(req, 42).ok());
    auto a = (*honest)->next_answer(std::chrono::seconds(20));
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_TRUE(a->ok && a->index == 42 && is_xor_of(a->payload, req));
  }
  EXPECT_EQ(d.stats().dropped_clients, cases.size());
}

// Bounded clients and idle deadlines: the cap is the dmx listener's (max_endpoints, set from
// max_connections), the idle deadline the dispatcher's.
TEST(LynxDmx, ListenerCapsAndIdleDeadline) {
  Events ev;
  ServerConfig cfg = dmx_config(ev, 1, 0);
  cfg.dispatch.max_connections = 2;
  cfg.dispatch.idle_timeout = std::chrono::milliseconds(500);
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  Dispatcher& d = (*server)->dispatcher();
  auto ctx = Context::create(client_options().set("connect_timeout", "5s"));
  ASSERT_TRUE(ctx.ok());
  auto a = ctx->connect(d.dmx_address());
  auto b = ctx->connect(d.dmx_address());
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(eventually([&] { return d.stats().dmx_clients == 2; }));
  auto c = ctx->connect(d.dmx_address());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().to_string().find("max_endpoints"), std::string::npos) << c.status().to_string();
  // Nothing sent: both are closed after idle_timeout, and a new client is served.
  ASSERT_TRUE(eventually([&] { return d.stats().idle_closed == 2; })) << ev.all();
  EXPECT_TRUE(ev.any_contains("closed dmx client", "idle_timeout")) << ev.all();
  ASSERT_TRUE(eventually([&] { return !a->health().ok() && !b->health().ok(); }));
  auto r = run_load(dmx_load(d.dmx_address(), LoadConfig::Face::kDmx, 1, 20));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->ok, 20u) << r->first_error;
}

// A client closed by the dispatcher (idle here) has a receive posted; its close ends that receive
// later, on another thread. The client that takes its place must not be taken for it.
TEST(LynxDmx, ANewClientIsNotMistakenForTheOneBefore) {
  Events ev;
  ServerConfig cfg = dmx_config(ev, 1, 0);
  cfg.dispatch.idle_timeout = std::chrono::milliseconds(100);
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  Dispatcher& d = (*server)->dispatcher();
  auto ctx = Context::create(client_options());
  ASSERT_TRUE(ctx.ok());
  for (uint64_t round = 1; round <= 10; ++round) {
    auto idle = ctx->connect(d.dmx_address());
    ASSERT_TRUE(idle.ok()) << idle.status().to_string();
    ASSERT_TRUE(eventually([&] { return d.stats().idle_closed == round; })) << ev.all();
    auto next = DmxRequester::connect(*ctx, d.dmx_address(), 4096);
    ASSERT_TRUE(next.ok()) << next.status().to_string();
    auto req = random_bytes(2000);
    ASSERT_TRUE((*next)->submit(req, round).ok());
    auto a = (*next)->next_answer(std::chrono::seconds(20));
    ASSERT_TRUE(a.ok()) << "round " << round << ": " << a.status().to_string() << "\n" << ev.all();
    EXPECT_TRUE(a->ok && a->index == round && is_xor_of(a->payload, req));
  }
}

// Remote queues: every request written by a one-sided write into the lent ring, byte-exact,
// alongside a two-sided client of the local worker.
TEST(LynxRemote, OneSidedWritesAreAnsweredByteExact) {
  Events ev;
  auto server = Server::start(dmx_config(ev, 1, 2));
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  Dispatcher& d = (*server)->dispatcher();
  auto r = run_load(dmx_load(d.dmx_address(), LoadConfig::Face::kRemote, 2, 1000));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->ok, 1000u) << r->first_error << "\n" << ev.all();
  // The rings come back once their clients went; so they can be lent again.
  EXPECT_EQ(d.stats().remote_granted, 2u);
  ASSERT_TRUE(eventually([&] { return d.stats().remote_lent == 0; })) << ev.all();
  r = run_load(dmx_load(d.dmx_address(), LoadConfig::Face::kRemote, 2, 200));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->ok, 200u) << r->first_error << "\n" << ev.all();
  ASSERT_TRUE((*server)->stop().ok());
  EXPECT_EQ(d.stats().remote_requests, 1200u);
  EXPECT_EQ(d.stats().remote_granted, 4u);
}

TEST(LynxRemote, NoFreeQueueIsRefusedWithTheReason) {
  Events ev;
  auto server = Server::start(dmx_config(ev, 1, 1));
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  auto ctx = Context::create(client_options());
  ASSERT_TRUE(ctx.ok());
  const std::string addr = (*server)->dispatcher().dmx_address();
  auto first = RemoteQueueClient::connect(*ctx, addr, std::chrono::seconds(20));
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  auto second = RemoteQueueClient::connect(*ctx, addr, std::chrono::seconds(20));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Code::kUnavailable);
  EXPECT_NE(second.status().to_string().find("all 1 remote queues are lent"), std::string::npos)
      << second.status().to_string();
}

// Sends request payloads through `c` and checks every answer byte for byte.
void round_trip(RemoteQueueClient& c, int n, size_t size) {
  for (int i = 0; i < n; ++i) {
    auto req = random_bytes(size);
    auto idx = c.submit(req);
    ASSERT_TRUE(idx.ok()) << idx.status().to_string();
    auto a = c.next_answer(std::chrono::seconds(20));
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_TRUE(a->ok && a->index == *idx && is_xor_of(a->payload, req)) << "index " << *idx;
  }
}

// A hostile client: a notification with an index it does not own, a write too long for a slot,
// a write outside its ring, a message on the queue's endpoint. Each is refused, its client closed
// with a line naming it; the honest client on the other ring is served all along.
TEST(LynxRemote, HostileClientIsClosedNamingWhatItDid) {
  Events ev;
  auto server = Server::start(dmx_config(ev, 1, 2, 8));
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  Dispatcher& d = (*server)->dispatcher();
  const std::string addr = d.dmx_address();
  auto ctx = Context::create(client_options());
  ASSERT_TRUE(ctx.ok());
  auto honest = RemoteQueueClient::connect(*ctx, addr, std::chrono::seconds(20));
  ASSERT_TRUE(honest.ok()) << honest.status().to_string();
  round_trip(**honest, 5, 100);

  struct Case {
    const char* name;
    std::function<void(RemoteQueueClient&)> act;
    const char* why;
  };
  std::vector<Case> cases = {
      {"index ahead",
       [](RemoteQueueClient& c) {
         const QueueGrant& g = c.grant();
         SlotHeader h{16, 0};
         std::vector<uint8_t> b = random_bytes(sizeof h + 16);
         std::memcpy(b.data(), &h, sizeof h);
         (void)c.write_raw(((g.first_slot + 5) % g.slots) * uint64_t{g.slot_bytes}, b, true, 5,
                           std::chrono::seconds(20));
       },
       "bad index 5"},
      {"index replayed",
       [](RemoteQueueClient& c) {
         round_trip(c, 2, 40);
         const QueueGrant& g = c.grant();
         SlotHeader h{16, 0};
         std::vector<uint8_t> b = random_bytes(sizeof h + 16);
         std::memcpy(b.data(), &h, sizeof h);
         (void)c.write_raw(g.first_slot * uint64_t{g.slot_bytes}, b, true, 0, std::chrono::seconds(20));
       },
       "bad index 0"},
      {"write longer than a slot",
       [](RemoteQueueClient& c) {
         const QueueGrant& g = c.grant();
         (void)c.write_raw(0, random_bytes(2 * g.slot_bytes), true, 0, std::chrono::seconds(20));
       },
       "bad write of"},
      {"write outside the ring",
       [](RemoteQueueClient& c) {
         const QueueGrant& g = c.grant();
         // dmx on this side checks the bounds it was given: claim a larger region.
         (void)c.write_raw(uint64_t{g.slots} * g.slot_bytes - 8, random_bytes(64), true, 0, std::chrono::seconds(20),
                           uint64_t{g.slots} * g.slot_bytes * 2);
       },
       "outside"},
      {"a message on a remote queue",
       [](RemoteQueueClient& c) {
         auto m = random_bytes(24);
         (void)c.endpoint().send(MemRegion{m.data(), m.size()}, 3).wait(std::chrono::seconds(20));
       },
       "sent a message while holding remote queue"},
  };
  uint64_t dropped = 0;
  for (const Case& k : cases) {
    // The other ring comes back once the last hostile client's requests are collected.
    ASSERT_TRUE(eventually([&] { return d.stats().remote_lent == 1; })) << ev.all();
    auto bad = RemoteQueueClient::connect(*ctx, addr, std::chrono::seconds(20));
    ASSERT_TRUE(bad.ok()) << k.name << ": " << bad.status().to_string();
    k.act(**bad);
    EXPECT_TRUE(eventually([&] { return !(*bad)->endpoint().health().ok(); })) << k.name << "\n" << ev.all();
    EXPECT_TRUE(eventually([&] { return ev.any_contains("dropped dmx client", k.why); })) << k.name << "\n" << ev.all();
    EXPECT_EQ(d.stats().dropped_clients, dropped + 1) << k.name << "\n" << ev.all();
    dropped = d.stats().dropped_clients;
    round_trip(**honest, 3, 1 + std::random_device{}() % 4096);
  }
}

// A full queue: with the workers paused, `slots` requests are written and the client's next
// submit says the queue is full; a client that notifies beyond its slots anyway is closed. Once the
// workers go on, every written request is answered byte-exact.
TEST(LynxRemote, FullQueueIsRefusedNotOverwritten) {
  Events ev;
  constexpr uint32_t kSlots = 4;
  auto server = Server::start(dmx_config(ev, 1, 2, kSlots));
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  Dispatcher& d = (*server)->dispatcher();
  auto ctx = Context::create(client_options());
  ASSERT_TRUE(ctx.ok());
  auto c = RemoteQueueClient::connect(*ctx, d.dmx_address(), std::chrono::seconds(20));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto over = RemoteQueueClient::connect(*ctx, d.dmx_address(), std::chrono::seconds(20));
  ASSERT_TRUE(over.ok()) << over.status().to_string();
  (*server)->cpu_workers()->set_paused(true);
  std::vector<std::vector<uint8_t>> sent;
  for (uint32_t i = 0; i < kSlots; ++i) {
    sent.push_back(random_bytes(1 + i * 500));
    ASSERT_TRUE((*c)->submit(sent.back()).ok());
  }
  auto full = (*c)->submit(random_bytes(10));
  EXPECT_EQ(full.status().code(), Code::kResourceExhausted) << full.status().to_string();
  // The other client fills its ring and then notifies one more index than it has slots.
  for (uint32_t i = 0; i < kSlots; ++i) ASSERT_TRUE((*over)->submit(random_bytes(32)).ok());
  ASSERT_TRUE(eventually([&] { return d.stats().remote_requests == 2 * kSlots; })) << ev.all();
  const QueueGrant& g = (*over)->grant();
  std::vector<uint8_t> b = random_bytes(sizeof(SlotHeader) + 32);
  SlotHeader h{32, 0};
  std::memcpy(b.data(), &h, sizeof h);
  (void)(*over)->write_raw(g.first_slot * uint64_t{g.slot_bytes}, b, true, kSlots, std::chrono::seconds(20));
  EXPECT_TRUE(eventually([&] { return ev.any_contains("bad index 4", "slots are full"); })) << ev.all();
  (*server)->cpu_workers()->set_paused(false);
  for (uint32_t i = 0; i < kSlots; ++i) {
    auto a = (*c)->next_answer(std::chrono::seconds(20));
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_TRUE(a->ok && a->index == i && is_xor_of(a->payload, sent[i])) << "index " << i;
  }
  round_trip(**c, 2 * kSlots, 777);
}

// A client that goes away with requests in flight: its answers are discarded, its ring is withdrawn
// (its key no longer works) and, once drained, lent to the next client, which is served byte-exact.
TEST(LynxRemote, AClientThatGoesAwayGivesItsRingBack) {
  Events ev;
  auto server = Server::start(dmx_config(ev, 1, 1));
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  Dispatcher& d = (*server)->dispatcher();
  const std::string addr = d.dmx_address();
  for (int round = 0; round < 3; ++round) {
    auto ctx = Context::create(client_options());
    ASSERT_TRUE(ctx.ok());
    // The last round's ring is let go of once its requests come back.
    ASSERT_TRUE(eventually([&] { return d.stats().remote_lent == 0; })) << ev.all();
    auto c = RemoteQueueClient::connect(*ctx, addr, std::chrono::seconds(20));
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    round_trip(**c, 3, 2000);
    (*server)->cpu_workers()->set_paused(true);
    for (int i = 0; i < 5; ++i) ASSERT_TRUE((*c)->submit(random_bytes(100)).ok());
    ASSERT_TRUE(eventually([&] { return d.stats().remote_requests == uint64_t(8 * (round + 1)); })) << ev.all();
    // Gone without a word: its context is destroyed with five requests unanswered.
    c->reset();
    *ctx = Context();
    (*server)->cpu_workers()->set_paused(false);
  }
  // Every request of the three was taken out of the ring (answered, or discarded when its client
  // had gone), and the ring is free again.
  ASSERT_TRUE(eventually([&] { return d.stats().remote_lent == 0; })) << ev.all();
  EXPECT_EQ(d.stats().responses, 24u);
  EXPECT_EQ(d.stats().remote_granted, 3u);
}

// The child of ClientKilledWithRequestsInFlight: takes a remote queue, writes five requests and
// waits to be killed (at most a minute). Disabled: only that test runs it, in a process of its own.
TEST(LynxRemote, DISABLED_ChildWritesThenWaitsToBeKilled) {
  const char* addr = std::getenv("DMX_TEST_LYNX_REMOTE_ADDR");
  ASSERT_NE(addr, nullptr);
  auto ctx = Context::create(client_options());
  ASSERT_TRUE(ctx.ok());
  auto c = RemoteQueueClient::connect(*ctx, addr, std::chrono::seconds(20));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE((*c)->submit(random_bytes(1 + i * 700)).ok());
  std::this_thread::sleep_for(std::chrono::seconds(60));
}

// A client process killed (SIGKILL) with five requests in its ring: dmx reports the lost peer, the
// dispatcher drops it naming it, the ring is withdrawn, drained and lent to the next client, which
// is served byte-exact.
TEST(LynxRemote, ClientKilledWithRequestsInFlight) {
  Events ev;
  auto server = Server::start(dmx_config(ev, 1, 1));
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  Dispatcher& d = (*server)->dispatcher();
  (*server)->cpu_workers()->set_paused(true);
  const std::string addr = d.dmx_address();
  pid_t child = ::fork();
  if (child == 0) {
    ::setenv("DMX_TEST_LYNX_REMOTE_ADDR", addr.c_str(), 1);
    ::execl("/proc/self/exe", "lynx-child", "--gtest_filter=LynxRemote.DISABLED_ChildWritesThenWaitsToBeKilled",
            "--gtest_also_run_disabled_tests", nullptr);
    ::_exit(127);
  }
  ASSERT_GT(child, 0);
  bool in = eventually([&] { return d.stats().remote_requests == 5; });
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ASSERT_TRUE(in) << ev.all();
  EXPECT_TRUE(eventually([&] { return ev.any_contains("dropped dmx client", "lost the peer"); })) << ev.all();
  (*server)->cpu_workers()->set_paused(false);
  ASSERT_TRUE(eventually([&] { return d.stats().remote_lent == 0; })) << ev.all();
  EXPECT_EQ(d.stats().responses, 5u);
  auto ctx = Context::create(client_options());
  ASSERT_TRUE(ctx.ok());
  auto c = RemoteQueueClient::connect(*ctx, addr, std::chrono::seconds(20));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  round_trip(**c, 20, 3000);
}

}  // namespace
}  // namespace dmx::mqueue
