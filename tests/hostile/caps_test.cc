// Caps that must not lock a good client out: idle pre-auth connections from its own address,
// endpoints of one peer filling max_endpoints, endpoints whose peer has gone still counted, same-host
// peers that never set up their paths filling the set-up slots, and the memory peers make a
// context hold (peer_memory_budget). Each refusal says why, on both sides.
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <future>
#include <thread>

#include "engine/auth.h"
#include "engine/context_impl.h"
#include "engine/handshake.h"
#include "engine/transport_setup.h"
#include "hostile/hostile_util.h"
#include "stream/socket.h"
#include "test_env.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;

UniqueFd dial(const std::string& address) {
  auto addr = stream::parse_address(address);
  if (!addr.ok()) return UniqueFd();
  auto fd = stream::connect_to(*addr, Deadline::after(30s));
  return fd.ok() ? std::move(*fd) : UniqueFd();
}

// 4 idle connections from the client's own address (max_pending_per_address=4), reopened as soon
// as the server drops them: a good client still connects every time, and a connection the server
// drops for the cap is told so (a REJECT naming the address and the setting).
TEST(Caps, IdleConnectionsFromTheClientsOwnAddressDoNotLockItOut) {
  Options so = test_options(1);
  so.set("max_pending_per_address", "4").set("handshake_timeout", "5s");
  Server s = make_server(so);
  std::atomic<bool> stop{false};
  std::atomic<int> rejects{0}, reopened{0};
  std::string reject_text;
  std::mutex text_mu;
  std::thread flood([&] {
    std::vector<UniqueFd> fds;
    for (int i = 0; i < 4; ++i) fds.push_back(dial(s.listener.address()));
    while (!stop.load()) {
      std::vector<pollfd> p;
      for (auto& fd : fds) p.push_back({fd.get(), POLLIN, 0});
      if (::poll(p.data(), p.size(), 20) <= 0) continue;
      for (size_t i = 0; i < fds.size(); ++i) {
        if (p[i].revents == 0) continue;
        auto f = recv_frame(fds[i].get(), Deadline::after(200ms), "server");
        std::string text = f.ok() ? std::string(f->payload.begin(), f->payload.end()) : std::string();
        if (f.ok() && f->header.type == wire::FrameType::kReject && text.find("max_pending") != std::string::npos) {
          ++rejects;
          std::lock_guard<std::mutex> lock(text_mu);
          reject_text = text;
        }
        fds[i] = dial(s.listener.address());  // reopened at once
        ++reopened;
      }
    }
  });
  std::this_thread::sleep_for(300ms);
  Options co = test_options(1);
  co.set("connect_timeout", "60s");
  auto client = Context::create(co);
  ASSERT_TRUE(client.ok());
  int served = 0;
  int refused = 0;
  for (int i = 0; i < 4; ++i) {
    // Arriving while every flood connection is younger than the eviction grace, the client is
    // refused, told why; it gets in once they are older.
    auto c = client->connect(s.listener.address());
    for (auto until = Clock::now() + kEventually; !c.ok() && Clock::now() < until; c = client->connect(s.listener.address())) {
      EXPECT_NE(c.status().message().find("max_pending_per_address"), std::string::npos) << c.status().to_string();
      ++refused;
      std::this_thread::sleep_for(100ms);
    }
    EXPECT_TRUE(c.ok()) << "connect " << i << ": " << c.status().to_string();
    if (!c.ok()) continue;
    auto e = s.listener.accept(kEventually);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    served += e.ok() ? 1 : 0;
  }
  stop = true;
  flood.join();
  std::printf("good client served %d of 4 times beside 4 idle connections from its address (%d reopened, %d "
              "attempts refused)\n",
              served, reopened.load(), refused);
  EXPECT_EQ(served, 4);
  ASSERT_GT(rejects.load(), 0) << "no dropped connection was told why";
  std::lock_guard<std::mutex> lock(text_mu);
  EXPECT_NE(reject_text.find("127.0.0.1"), std::string::npos) << reject_text;
  EXPECT_NE(reject_text.find("max_pending_per_address"), std::string::npos) << reject_text;
}

// An endpoint the server's application closes stops counting against max_endpoints at once, not
// when its threads end: here its worker is held in a completion callback, so its threads cannot
// end, and a new client must still get in at max_endpoints=1. (Were it counted until its threads
// end, the new client would be refused "max_endpoints" for as long as the callback runs.)
TEST(Caps, ClosedEndpointsStopCountingAtOnce) {
  Options so = test_options(1);
  so.set("max_endpoints", "1").set("transport", "tcp").set("stream_worker_scope", "endpoint");
  Server s = make_server(so);
  auto client = Context::create(test_options(1).set("transport", "tcp"));
  ASSERT_TRUE(client.ok());
  auto c1 = client->connect(s.listener.address());
  ASSERT_TRUE(c1.ok()) << c1.status().to_string();
  auto e1 = s.listener.accept(kEventually);
  ASSERT_TRUE(e1.ok()) << e1.status().to_string();
  // The server's recv completes on e1's own worker, which then waits in the callback.
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  Filled src = filled(MemSpec{}, 4096);
  Buffer dst = poisoned(MemSpec{}, 4096);
  OpOptions held;
  held.on_complete = [&entered, released](const Status&, size_t) {
    entered.set_value();
    (void)released.wait_for(kEventually);
  };
  (void)e1->recv(dst.region(), 1, held);
  ASSERT_TRUE(c1->send(src.buf.region(), 1).wait(kEventually).ok());
  ASSERT_EQ(entered.get_future().wait_for(kEventually), std::future_status::ready);
  // Closing waits for that worker; the slot must be free before.
  std::thread closer([&] { (void)e1->close(); });
  for (auto until = Clock::now() + 20s; s.ctx.impl()->live_endpoints() > 0 && Clock::now() < until;)
    std::this_thread::sleep_for(10ms);
  auto c2 = client->connect(s.listener.address());
  Status second = c2.ok() ? Status() : c2.status();
  release.set_value();
  closer.join();
  ASSERT_TRUE(second.ok()) << "a closed endpoint still counted: " << second.to_string();
  auto e2 = s.listener.accept(kEventually);
  EXPECT_TRUE(e2.ok()) << e2.status().to_string();
}

// One authenticated handshake done by hand with a HELLO naming process `pid` (transport tcp, one
// stream): ok once the server welcomed it, else the server's REJECT as an error.
Status handshake_as(const Server& s, uint32_t pid, UniqueFd* out) {
  Context mine_ctx = *Context::create(test_options(1).set("transport", "tcp"));
  const ContextImpl& me = *mine_ctx.impl();
  wire::Hello mine = make_hello(me, wire::Role::kClient);
  mine.pid = pid;
  std::string why_not;
  offer_transports(me, &mine, nullptr, &why_not);
  Deadline d = Deadline::after(30s);
  UniqueFd fd = dial(s.listener.address());
  if (!fd.valid()) return Status(Code::kIo, "dial");
  DMX_RETURN_IF_ERROR(send_frame(fd.get(), wire::FrameType::kHello, wire::encode_hello(mine), d, "s"));
  DMX_ASSIGN_OR_RETURN(Frame hello, recv_frame(fd.get(), d, "s"));
  if (hello.header.type == wire::FrameType::kReject)
    return Status(Code::kResourceExhausted, std::string(hello.payload.begin(), hello.payload.end()));
  auto theirs = wire::decode_hello(hello.payload.data(), hello.payload.size());
  if (!theirs.ok()) return theirs.status();
  wire::Proof proof = make_proof(me.auth(), kClientLabel, mine.nonce, theirs->nonce, theirs->session);
  DMX_RETURN_IF_ERROR(send_frame(fd.get(), wire::FrameType::kAuth, {proof.begin(), proof.end()}, d, "s"));
  DMX_ASSIGN_OR_RETURN(Frame welcome, recv_frame(fd.get(), d, "s"));
  if (welcome.header.type != wire::FrameType::kWelcome)
    return Status(Code::kResourceExhausted, std::string(welcome.payload.begin(), welcome.payload.end()));
  *out = std::move(fd);
  return Status();
}

// One peer (this process) opens endpoints until refused: it gets max_endpoints_per_peer of them,
// and the refusal names the setting; another peer still gets in although the total would have
// filled max_endpoints.
TEST(Caps, OnePeerCannotTakeEveryEndpoint) {
  Options so = test_options(1);
  so.set("max_endpoints", "4").set("max_endpoints_per_peer", "2").set("transport", "tcp");
  Server s = make_server(so);
  auto client = Context::create(test_options(1).set("transport", "tcp"));
  ASSERT_TRUE(client.ok());
  std::vector<Endpoint> mine, theirs;
  Status refusal;
  for (int i = 0; i < 4; ++i) {
    auto c = client->connect(s.listener.address());
    if (!c.ok()) {
      refusal = c.status();
      continue;
    }
    mine.push_back(std::move(*c));
    auto e = s.listener.accept(kEventually);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    theirs.push_back(std::move(*e));
  }
  EXPECT_EQ(mine.size(), 2u) << "one peer took " << mine.size() << " of 4 endpoints";
  EXPECT_EQ(refusal.code(), Code::kResourceExhausted) << refusal.to_string();
  EXPECT_NE(refusal.message().find("max_endpoints_per_peer"), std::string::npos) << refusal.to_string();
  EXPECT_NE(refusal.message().find("refused"), std::string::npos) << refusal.to_string();
  // Another process (another pid in its HELLO) is welcome.
  UniqueFd other;
  Status st = handshake_as(s, static_cast<uint32_t>(::getpid()) + 1, &other);
  EXPECT_TRUE(st.ok()) << st.to_string();
  auto e = s.listener.accept(kEventually);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
}

// At max_endpoints, a newcomer evicts an idle endpoint of the peer that holds the most, never one
// with work in flight, and never below that peer's fair share (so never the newcomer's own); when
// none can be evicted, the refusal says why.
TEST(Caps, MaxEndpointsEvictsAnIdleEndpointOfThePeerHoldingTheMost) {
  Options so = test_options(1);
  so.set("max_endpoints", "4").set("max_endpoints_per_peer", "0").set("transport", "tcp");
  Server s = make_server(so);
  auto client = Context::create(test_options(1).set("transport", "tcp"));
  ASSERT_TRUE(client.ok());
  std::vector<Endpoint> mine, theirs;
  for (int i = 0; i < 4; ++i) {
    auto c = client->connect(s.listener.address());
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    mine.push_back(std::move(*c));
    auto e = s.listener.accept(kEventually);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    theirs.push_back(std::move(*e));
  }
  std::this_thread::sleep_for(700ms);  // older than the eviction grace (500 ms)
  // Another process gets in: one of this process's idle endpoints makes room.
  UniqueFd second;
  Status st = handshake_as(s, static_cast<uint32_t>(::getpid()) + 1, &second);
  ASSERT_TRUE(st.ok()) << "refused instead of evicting: " << st.to_string();
  auto e2 = s.listener.accept(kEventually);
  ASSERT_TRUE(e2.ok()) << e2.status().to_string();
  int evicted = -1;
  for (int i = 0; i < 4; ++i)
    if (!theirs[i].health().ok()) evicted = i;
  ASSERT_GE(evicted, 0) << "no endpoint evicted";
  Status why = theirs[evicted].health();
  EXPECT_EQ(why.code(), Code::kResourceExhausted) << why.to_string();
  EXPECT_NE(why.message().find("evicted for another peer"), std::string::npos) << why.to_string();
  EXPECT_NE(why.message().find("max_endpoints"), std::string::npos) << why.to_string();
  // Its client is told why.
  Status told;
  for (auto until = Clock::now() + kEventually; told.ok() && Clock::now() < until;) {
    told = mine[evicted].health();
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_NE(told.message().find("evicted for another peer"), std::string::npos) << told.to_string();
  // The other three each have a receive posted: work in flight, never evicted. A third process is
  // refused, saying so.
  std::vector<Buffer> bufs;
  std::vector<Request> posted;
  for (int i = 0; i < 4; ++i) {
    if (i == evicted) continue;
    bufs.push_back(poisoned(MemSpec{}, 64));
    posted.push_back(theirs[i].recv(bufs.back().region(), 99));
  }
  UniqueFd third;
  st = handshake_as(s, static_cast<uint32_t>(::getpid()) + 2, &third);
  EXPECT_EQ(st.code(), Code::kResourceExhausted) << st.to_string();
  EXPECT_NE(st.message().find("work in flight"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("max_endpoints"), std::string::npos) << st.to_string();
  for (auto& r : posted) EXPECT_FALSE(r.test());
  // This process holds 3 and the other 1: it may not evict the other's only endpoint.
  auto again = client->connect(s.listener.address());
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("fair share"), std::string::npos) << again.status().to_string();
  EXPECT_TRUE(e2->health().ok()) << e2->health().to_string();
  std::printf("evicted: %s\nrefused (busy): %s\nrefused (share): %s\n", why.message().c_str(), st.message().c_str(),
              again.status().message().c_str());
}

// An authenticated same-host peer that offers shm and never sets up its side (listener_flood_test
// does one): it holds a set-up thread until its handshake deadline.
struct StalledSetup {
  UniqueFd fd;
  std::optional<UnixListener> side;  // listens; nobody accepts on it
};

Status stall_setup(const Server& s, const ContextImpl& me, StalledSetup* out) {
  wire::Hello mine = make_hello(me, wire::Role::kClient);
  std::string why_not;
  offer_transports(me, &mine, &out->side, &why_not);
  if (!mine.offer("shm") && !mine.offer("shm_pipe")) return Status(Code::kUnavailable, why_not);
  Deadline d = Deadline::after(30s);
  out->fd = dial(s.listener.address());
  if (!out->fd.valid()) return Status(Code::kIo, "dial");
  DMX_RETURN_IF_ERROR(send_frame(out->fd.get(), wire::FrameType::kHello, wire::encode_hello(mine), d, "s"));
  DMX_ASSIGN_OR_RETURN(Frame hello, recv_frame(out->fd.get(), d, "s"));
  if (hello.header.type != wire::FrameType::kHello) return Status(Code::kProtocol, "no HELLO");
  auto theirs = wire::decode_hello(hello.payload.data(), hello.payload.size());
  if (!theirs.ok()) return theirs.status();
  wire::Proof proof = make_proof(me.auth(), kClientLabel, mine.nonce, theirs->nonce, theirs->session);
  DMX_RETURN_IF_ERROR(send_frame(out->fd.get(), wire::FrameType::kAuth, {proof.begin(), proof.end()}, d, "s"));
  DMX_ASSIGN_OR_RETURN(Frame welcome, recv_frame(out->fd.get(), d, "s"));
  if (welcome.header.type != wire::FrameType::kWelcome) return Status(Code::kProtocol, "no WELCOME");
  return Status();
}

// 66 stalled set-ups, more than the listener runs at once (64): a good client, over TCP or over
// shm, is served at once rather than seeing its handshake succeed and its first operation fail.
TEST(Caps, StalledSetUpsDoNotLockOutOthers) {
  Options so = test_options(1);
  so.set("handshake_timeout", "20s").set("max_endpoints_per_peer", "0");
  Server s = make_server(so);
  Context mine_ctx = *Context::create(test_options(1));
  std::vector<StalledSetup> stalled(66);
  for (auto& st : stalled) {
    Status r = stall_setup(s, *mine_ctx.impl(), &st);
    if (r.code() == Code::kUnavailable) DMX_SKIP(::dmx::test::kNotAgreed) << "no same-host path here: " << r.to_string();
    ASSERT_TRUE(r.ok()) << r.to_string();
  }
  std::this_thread::sleep_for(200ms);
  for (const char* transport : {"tcp", "auto"}) {
    Options co = test_options(1);
    co.set("transport", transport).set("connect_timeout", "60s");
    auto client = Context::create(co);
    ASSERT_TRUE(client.ok());
    auto t0 = Clock::now();
    auto c = client->connect(s.listener.address());
    ASSERT_TRUE(c.ok()) << transport << ": " << c.status().to_string();
    auto e = s.listener.accept(kEventually);
    ASSERT_TRUE(e.ok()) << transport << ": " << e.status().to_string();
    Filled src = filled(MemSpec{}, 100000);
    Buffer dst = poisoned(MemSpec{}, 100000);
    Request r = e->recv(dst.region(), 1);
    Status sent = c->send(src.buf.region(), 1).wait(kEventually);
    EXPECT_TRUE(sent.ok()) << transport << ": " << sent.to_string();
    EXPECT_TRUE(r.wait(kEventually).ok()) << transport;
    EXPECT_EQ(read_back(dst.region()), src.data) << transport;
    std::printf("%s client served in %lld ms beside 66 stalled set-ups\n", transport,
                static_cast<long long>(
                    std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count()));
  }
}

// Endpoints of one peer, each within its own unexpected_budget, together past the context's
// peer_memory_budget: the one that would go over is closed with a reason naming the peer and the
// budget; the memory held stays under the budget; the others and a good client go on.
TEST(Caps, UnexpectedDataOfManyEndpointsSharesOneBudget) {
  Options so = test_options(1);
  so.set("unexpected_budget", "2M").set("peer_memory_budget", "5M").set("transport", "tcp");
  Server s = make_server(so);
  auto client = Context::create(test_options(1).set("transport", "tcp"));
  ASSERT_TRUE(client.ok());
  std::vector<Endpoint> mine, theirs;
  for (int i = 0; i < 4; ++i) {
    auto c = client->connect(s.listener.address());
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    mine.push_back(std::move(*c));
    auto e = s.listener.accept(kEventually);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    theirs.push_back(std::move(*e));
  }
  // 1.9 MB of eager messages per endpoint to a tag nobody receives: each within its own 2 MiB.
  Filled src = filled(MemSpec{}, 15000);
  for (auto& c : mine) {
    std::vector<Request> sent;
    for (int k = 0; k < 126; ++k) sent.push_back(c.send(src.buf.region(), 7));
    for (auto& r : sent) (void)r.wait(kEventually);
  }
  std::printf("server holds %llu of %llu budget bytes\n",
              static_cast<unsigned long long>(s.ctx.impl()->memory_budget()->used()),
              static_cast<unsigned long long>(s.ctx.impl()->memory_budget()->limit()));
  // The first endpoint over the budget fails once the server has read its data: wait for any.
  auto any_failed = [&] {
    for (auto& e : theirs)
      if (!e.health().ok()) return true;
    return false;
  };
  for (auto until = Clock::now() + kEventually; !any_failed() && Clock::now() < until;)
    std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(200ms);
  int failed = 0;
  Status why;
  for (auto& e : theirs) {
    Status h = e.health();
    if (!h.ok()) {
      ++failed;
      why = h;
    }
  }
  EXPECT_GE(failed, 1) << "7.6 MB of unexpected data held under a 5 MiB budget";
  // Receivers charge at once: on a slow (sanitized) build every endpoint may be the one over.
  EXPECT_EQ(why.code(), Code::kResourceExhausted) << why.to_string();
  EXPECT_NE(why.message().find("peer_memory_budget"), std::string::npos) << why.to_string();
  EXPECT_NE(why.message().find("127.0.0.1"), std::string::npos) << why.to_string();
  EXPECT_LE(s.ctx.impl()->memory_budget()->used(), uint64_t{5} << 20);
  // A receive on a surviving endpoint still gets its message.
  for (auto& e : theirs) {
    if (!e.health().ok()) continue;
    Buffer dst = poisoned(MemSpec{}, 15000);
    ASSERT_TRUE(e.recv(dst.region(), 7).wait(kEventually).ok());
    EXPECT_EQ(read_back(dst.region()), src.data);
    break;
  }
  theirs.clear();
  mine.clear();
  expect_serves_a_good_client(s);
}

// max_endpoints holds at AUTH as well as at HELLO: two peers that both passed HELLO while one
// endpoint was free cannot both get in (only the first to authenticate does; the second is told
// why, before its WELCOME).
TEST(Caps, MaxEndpointsIsCheckedAgainAtAuth) {
  Options so = test_options(1);
  so.set("max_endpoints", "1").set("max_endpoints_per_peer", "0").set("transport", "tcp");
  Server s = make_server(so);
  Context me_ctx = *Context::create(test_options(1).set("transport", "tcp"));
  const ContextImpl& me = *me_ctx.impl();
  struct Half {
    UniqueFd fd;
    wire::Hello mine, theirs;
  };
  auto hello = [&](uint32_t pid, Half* h) -> Status {
    h->mine = make_hello(me, wire::Role::kClient);
    h->mine.pid = pid;
    std::string why_not;
    offer_transports(me, &h->mine, nullptr, &why_not);
    Deadline d = Deadline::after(30s);
    h->fd = dial(s.listener.address());
    if (!h->fd.valid()) return Status(Code::kIo, "dial");
    DMX_RETURN_IF_ERROR(send_frame(h->fd.get(), wire::FrameType::kHello, wire::encode_hello(h->mine), d, "s"));
    DMX_ASSIGN_OR_RETURN(Frame f, recv_frame(h->fd.get(), d, "s"));
    if (f.header.type != wire::FrameType::kHello)
      return Status(Code::kResourceExhausted, std::string(f.payload.begin(), f.payload.end()));
    auto t = wire::decode_hello(f.payload.data(), f.payload.size());
    if (!t.ok()) return t.status();
    h->theirs = *t;
    return Status();
  };
  auto auth = [&](Half* h) -> Status {
    Deadline d = Deadline::after(30s);
    wire::Proof proof = make_proof(me.auth(), kClientLabel, h->mine.nonce, h->theirs.nonce, h->theirs.session);
    DMX_RETURN_IF_ERROR(send_frame(h->fd.get(), wire::FrameType::kAuth, {proof.begin(), proof.end()}, d, "s"));
    DMX_ASSIGN_OR_RETURN(Frame f, recv_frame(h->fd.get(), d, "s"));
    if (f.header.type != wire::FrameType::kWelcome)
      return Status(Code::kResourceExhausted, std::string(f.payload.begin(), f.payload.end()));
    return Status();
  };
  Half a, b;
  uint32_t pid = static_cast<uint32_t>(::getpid());
  ASSERT_TRUE(hello(pid + 1, &a).ok());
  ASSERT_TRUE(hello(pid + 2, &b).ok());
  ASSERT_TRUE(auth(&a).ok());
  auto ea = s.listener.accept(kEventually);
  ASSERT_TRUE(ea.ok()) << ea.status().to_string();
  Status second = auth(&b);
  EXPECT_EQ(second.code(), Code::kResourceExhausted) << "both got in at max_endpoints=1";
  EXPECT_NE(second.message().find("max_endpoints"), std::string::npos) << second.to_string();
  EXPECT_LE(s.ctx.impl()->live_endpoints(), 1);
}

// The peer that spent peer_memory_budget is the one refused: past half of the budget a peer holds
// at most its share of the other half, so a peer that holds little still gets memory (it was
// refused, and its endpoint closed, when another had spent it all).
TEST(Caps, SpentMemoryBudgetRefusesTheSpenderNotAnother) {
  auto ctx = Context::create(test_options(1).set("peer_memory_budget", "8M"));
  ASSERT_TRUE(ctx.ok());
  std::vector<MemoryCharge> held;
  Status refused;
  for (int i = 0; i < 16 && refused.ok(); ++i) {
    auto c = ctx->charge_memory(1 << 20, "10.0.0.1 (hog) pid 1", "eager data");
    if (c.ok()) held.push_back(std::move(*c));
    else refused = c.status();
  }
  EXPECT_EQ(held.size(), 4u) << "one peer took " << held.size() << " MiB of 8";
  EXPECT_EQ(refused.code(), Code::kResourceExhausted) << refused.to_string();
  EXPECT_NE(refused.message().find("peer 10.0.0.1 (hog) pid 1"), std::string::npos) << refused.to_string();
  EXPECT_NE(refused.message().find("peer_memory_budget"), std::string::npos) << refused.to_string();
  // Another peer gets its share of the rest: 2 MiB of the other 4, the hog still holding its 4.
  std::vector<MemoryCharge> other;
  for (int i = 0; i < 2; ++i) {
    auto c = ctx->charge_memory(1 << 20, "10.0.0.2 (good) pid 2", "eager data");
    ASSERT_TRUE(c.ok()) << "an innocent peer refused: " << c.status().to_string();
    other.push_back(std::move(*c));
  }
  auto more = ctx->charge_memory(1 << 20, "10.0.0.1 (hog) pid 1", "eager data");
  EXPECT_FALSE(more.ok());
  std::printf("the spender refused: %s\n", refused.message().c_str());
  // Given back, the budget is whole again.
  held.clear();
  other.clear();
  EXPECT_EQ(ctx->impl()->memory_budget()->used(), 0u);
  auto big = ctx->charge_memory(4 << 20, "10.0.0.2 (good) pid 2", "eager data");
  EXPECT_TRUE(big.ok()) << big.status().to_string();
}

}  // namespace
}  // namespace dmx::test
