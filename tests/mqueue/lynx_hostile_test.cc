// Hostile clients: garbage and oversized datagrams, a TCP length over the limit, a bad magic,
// disconnects mid-request. Each is dropped with a message naming it; good clients go on.
#include <random>
#include <thread>

#include "mqueue_test_util.h"

namespace dmx::mqueue {
namespace {

using testing::Events;
using testing::frame;

LoadConfig good_load(const std::string& addr, bool udp) {
  LoadConfig load;
  load.udp = udp;
  load.address = addr;
  load.clients = 3;
  load.requests = 150;
  load.sizes = {1, 0, 99, 1024};
  load.seed = std::random_device{}();
  load.timeout = std::chrono::seconds(10);
  return load;
}

TEST(LynxHostile, BadDatagramsAreDroppedAndNamed) {
  Events ev;
  auto server = Server::start(testing::host_config(ev, 2, 8, 1024));
  ASSERT_TRUE(server.ok());
  Dispatcher& d = (*server)->dispatcher();
  auto addr = resolve(d.udp_address());
  ASSERT_TRUE(addr.ok());
  Fd bad(::socket(AF_INET, SOCK_DGRAM, 0));
  ASSERT_EQ(::connect(bad.get(), addr->sa(), addr->len), 0);
  const std::string name = "udp client " + testing::local_name(bad.get());

  std::mt19937 rng(std::random_device{}());
  std::vector<std::vector<uint8_t>> garbage;
  garbage.push_back({});                                                    // empty
  garbage.push_back({1, 2, 3});                                             // shorter than a header
  garbage.push_back(std::vector<uint8_t>(200));                             // zeros: bad magic
  garbage.push_back(frame(kRequestMagic, 5000, 1, std::vector<uint8_t>(1500)));  // over the limit
  garbage.push_back(frame(kRequestMagic, 10, 2, std::vector<uint8_t>(3)));   // length disagrees
  garbage.push_back(frame(kRequestMagic, 0xffffffffu, 3, {}));              // length would wrap
  for (int i = 0; i < 20; ++i) {
    std::vector<uint8_t> g(rng() % 1500);
    for (auto& b : g) b = static_cast<uint8_t>(rng());
    garbage.push_back(g);
  }
  std::thread attacker([&] {
    for (const auto& g : garbage) (void)::send(bad.get(), g.data(), g.size(), 0);
  });
  auto r = run_load(good_load(d.udp_address(), true));
  attacker.join();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->ok, 150u) << r->first_error << "\n" << ev.all();
  ASSERT_TRUE(testing::eventually([&] { return d.stats().bad_datagrams == garbage.size(); }))
      << d.stats().bad_datagrams << "\n" << ev.all();
  EXPECT_TRUE(ev.any_contains(name, "bad magic")) << ev.all();
  EXPECT_TRUE(ev.any_contains(name, "over the 1024 B request limit")) << ev.all();
  EXPECT_TRUE(ev.any_contains(name, "shorter than the 16-byte header")) << ev.all();
}

TEST(LynxHostile, BadTcpClientsAreDroppedAndOthersGoOn) {
  Events ev;
  auto server = Server::start(testing::host_config(ev, 2, 8, 1024));
  ASSERT_TRUE(server.ok());
  Dispatcher& d = (*server)->dispatcher();
  auto addr = resolve(d.tcp_address());
  ASSERT_TRUE(addr.ok());
  auto connect = [&] {
    auto c = tcp_connect(*addr, std::chrono::seconds(5));
    EXPECT_TRUE(c.ok());
    return c.ok() ? std::move(*c) : Fd();
  };
  struct Bad {
    Fd fd;
    std::string name, says;
  };
  std::vector<Bad> bads;
  auto add = [&](const std::vector<uint8_t>& bytes, bool close_after, const std::string& says) {
    Bad b{connect(), "", says};
    b.name = "tcp client " + testing::local_name(b.fd.get());
    (void)::send(b.fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (close_after) b.fd.reset();
    bads.push_back(std::move(b));
  };
  add(frame(kRequestMagic, 1025, 1, {}), false, "request length 1025 over the limit 1024");
  add(frame(kRequestMagic, 0xffffffffu, 1, {}), false, "request length 4294967295 over the limit");
  add(frame(0xdeadbeef, 4, 1, {1, 2, 3, 4}), false, "bad magic 0xdeadbeef");
  add(std::vector<uint8_t>{0x4c, 0x59, 0x4e}, true, "disconnected mid-request (3 of 16 header bytes)");
  add(frame(kRequestMagic, 100, 1, std::vector<uint8_t>(40)), true,
      "disconnected mid-request (40 of 100 payload bytes)");

  auto r = run_load(good_load(d.tcp_address(), false));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->ok, 150u) << r->first_error << "\n" << ev.all();
  for (const Bad& b : bads)
    EXPECT_TRUE(testing::eventually([&] { return ev.any_contains(b.name, b.says); }))
        << "expected '" << b.name << ": " << b.says << "' in:\n" << ev.all();
  EXPECT_EQ(d.stats().dropped_clients, bads.size());
  // A dropped client's socket is closed by the server.
  char c;
  for (Bad& b : bads)
    if (b.fd.valid()) {
      ASSERT_TRUE(set_io_timeout(b.fd.get(), std::chrono::seconds(10)).ok());
      EXPECT_LE(::recv(b.fd.get(), &c, 1, 0), 0);
    }
}

// A client that begins a request and goes silent is dropped at request_timeout.
TEST(LynxHostile, StalledTcpClientIsDropped) {
  Events ev;
  ServerConfig cfg = testing::host_config(ev, 1, 4, 1024);
  cfg.dispatch.request_timeout = std::chrono::milliseconds(300);
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok());
  Dispatcher& d = (*server)->dispatcher();
  auto addr = resolve(d.tcp_address());
  auto idle = tcp_connect(*addr, std::chrono::seconds(5));  // connected, sends nothing: fine
  auto header = tcp_connect(*addr, std::chrono::seconds(5));
  auto payload = tcp_connect(*addr, std::chrono::seconds(5));
  ASSERT_TRUE(idle.ok() && header.ok() && payload.ok());
  auto f = frame(kRequestMagic, 64, 1, std::vector<uint8_t>(10));
  ASSERT_EQ(::send(header->get(), f.data(), 5, 0), 5);
  ASSERT_EQ(::send(payload->get(), f.data(), f.size(), 0), static_cast<ssize_t>(f.size()));
  const std::string h = "tcp client " + testing::local_name(header->get());
  const std::string p = "tcp client " + testing::local_name(payload->get());
  EXPECT_TRUE(testing::eventually([&] { return ev.any_contains(h, "stalled mid-request (5 bytes of the header"); }))
      << ev.all();
  EXPECT_TRUE(testing::eventually([&] { return ev.any_contains(p, "stalled mid-request (10 bytes of the payload"); }))
      << ev.all();
  EXPECT_FALSE(ev.any_contains("tcp client " + testing::local_name(idle->get()))) << ev.all();
  auto r = run_load(good_load(d.tcp_address(), false));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->ok, 150u) << r->first_error;
}

// A client that disconnects with answers still in the queues: the answers are discarded.
TEST(LynxHostile, ClientGoneBeforeItsAnswers) {
  Events ev;
  auto server = Server::start(testing::host_config(ev, 1, 4, 1024));
  ASSERT_TRUE(server.ok());
  Dispatcher& d = (*server)->dispatcher();
  (*server)->cpu_workers()->set_paused(true);
  auto addr = resolve(d.tcp_address());
  auto c = tcp_connect(*addr, std::chrono::seconds(5));
  ASSERT_TRUE(c.ok());
  for (uint64_t i = 0; i < 3; ++i) {
    auto f = frame(kRequestMagic, 8, i, std::vector<uint8_t>(8, 1));
    ASSERT_EQ(::send(c->get(), f.data(), f.size(), 0), static_cast<ssize_t>(f.size()));
  }
  ASSERT_TRUE(testing::eventually([&] { return d.stats().requests == 3; }));
  c->reset();
  (*server)->cpu_workers()->set_paused(false);
  // Each answer is discarded, or fails to send and drops the connection (when the dispatcher
  // collects it before it has seen the goodbye); either way the dispatcher gets past all three.
  ASSERT_TRUE(testing::eventually([&] { return d.stats().responses == 3; })) << ev.all();
  EXPECT_GE(d.stats().responses_discarded, 1u);
  auto r = run_load(good_load(d.tcp_address(), false));  // the server goes on
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->ok, 150u) << r->first_error << "\n" << ev.all();
}

}  // namespace
}  // namespace dmx::mqueue
