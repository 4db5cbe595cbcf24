// The shm link: byte-exact delivery across threads and processes, odd sizes and offsets, many
// operations in flight, both directions at once, device memory staged through the ring (sim).
#include <gtest/gtest.h>

#include <future>
#include <random>
#include <thread>

#include "core/config.h"
#include "core/sys.h"
#include "memory/backend.h"
#include "transport/transport_test_util.h"

namespace dmx::shm {
namespace {

using testing::check_pattern;
using testing::fill_pattern;
using testing::Pump;
using testing::secs;

constexpr auto kSend = Completion::kSend;
constexpr auto kRecv = Completion::kRecv;

struct LinkPair {
  std::unique_ptr<ShmLink> a, b;
};

LinkPair make_threaded_pair(LinkOptions options = {}, std::shared_ptr<CopyCrew> accept_crew = nullptr) {
  auto p = UnixChannel::pair();
  EXPECT_TRUE(p.ok());
  auto fut = std::async(std::launch::async, [&] { return ShmLink::accept(std::move(p->second), secs(10), accept_crew); });
  auto a = ShmLink::create(std::move(p->first), options, secs(10));
  auto b = fut.get();
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  if (!a.ok() || !b.ok()) return {};
  return {std::move(*a), std::move(*b)};
}

// Sends `n` bytes at src offset `so` to a buffer at dst offset `dso`, through threads; checks the
// bytes and that the guard bytes around the destination are untouched.
void send_one(LinkPair& lp, MsgId id, size_t n, size_t so, size_t dso) {
  std::vector<uint8_t> src(n + so), dst(n + dso + 64, 0xEE);
  fill_pattern(src.data() + so, n, id);
  MemRegion s{src.data() + so, n, {}}, d{dst.data() + dso, n, {}};
  ASSERT_TRUE(lp.b->post_recv(id, d).ok());
  ASSERT_TRUE(lp.a->post_send(id, s).ok());
  auto rx = std::async(std::launch::async, [&] {
    Pump pump(lp.b.get());
    size_t bytes = 0;
    Status st = pump.finish(kRecv, id, secs(60), &bytes);
    return st.ok() && bytes != n ? Status(Code::kInternal, "wrong length") : st;
  });
  Pump pump(lp.a.get());
  size_t sent = 99;
  Status st = pump.finish(kSend, id, secs(60), &sent);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(sent, n);
  Status rs = rx.get();
  ASSERT_TRUE(rs.ok()) << rs.to_string();
  EXPECT_EQ(check_pattern(dst.data() + dso, n, id), SIZE_MAX) << "size " << n;
  for (size_t i = 0; i < dso; ++i) ASSERT_EQ(dst[i], 0xEE);
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(dst[dso + n + i], 0xEE);
}

TEST(ShmLink, OddSizesAndOffsetsThreads) {
  LinkPair lp = make_threaded_pair();
  ASSERT_TRUE(lp.a && lp.b);
  MsgId id = 1;
  for (size_t n : {size_t(0), size_t(1), size_t(4097), size_t(256 * 1024), size_t(256 * 1024 + 1), size_t(64 << 20) + 3})
    for (auto [so, dso] : {std::pair<size_t, size_t>{0, 0}, {1, 7}, {4093, 3}}) send_one(lp, id++, n, so, dso);
  EXPECT_GT(lp.a->stats().host_copies, 0u);
  EXPECT_EQ(lp.a->stats().device_copies, 0u);
}

// Large copies into and out of the slots shared by a crew on each side (ordinary stores into the
// ring, non-temporal out of it from kBulkMessage up), one way and then the other.
TEST(ShmLink, OddSizesAndOffsetsWithCopyCrews) {
  LinkPair lp = make_threaded_pair({.slot_size = 4 << 20, .slots = 4, .crew = std::make_shared<CopyCrew>(3)},
                                   std::make_shared<CopyCrew>(2));
  ASSERT_TRUE(lp.a && lp.b);
  MsgId id = 1;
  for (size_t n : {size_t(512 * 1024), kBulkMessage - 1, kBulkMessage, kBulkMessage + 1, size_t(4 << 20) - 1,
                   size_t(64 << 20) + 3})
    for (auto [so, dso] : {std::pair<size_t, size_t>{0, 0}, {1, 7}, {4093, 3}}) send_one(lp, id++, n, so, dso);
  std::swap(lp.a, lp.b);
  for (size_t n : {size_t(3 << 20) + 5, size_t(17 << 20) + 1}) send_one(lp, id++, n, 5, 1);
}

TEST(ShmLink, TruncatedMessageFailsAloneAndTheNextArrives) {
  LinkPair lp = make_threaded_pair({.slot_size = 4096, .slots = 4});
  ASSERT_TRUE(lp.a && lp.b);
  std::vector<uint8_t> big(100000), small(1000), next(5000), next_dst(5000);
  fill_pattern(next.data(), next.size(), 9);
  ASSERT_TRUE(lp.b->post_recv(1, {small.data(), small.size(), {}}).ok());
  ASSERT_TRUE(lp.b->post_recv(2, {next_dst.data(), next_dst.size(), {}}).ok());
  ASSERT_TRUE(lp.a->post_send(1, {big.data(), big.size(), {}}).ok());
  ASSERT_TRUE(lp.a->post_send(2, {next.data(), next.size(), {}}).ok());
  auto tx = std::async(std::launch::async, [&] {
    Pump p(lp.a.get());
    Status s = p.finish(kSend, 1, secs(10));
    return s.ok() ? p.finish(kSend, 2, secs(10)) : s;
  });
  Pump p(lp.b.get());
  size_t announced = 0;
  Status s = p.finish(kRecv, 1, secs(10), &announced);
  EXPECT_EQ(s.code(), Code::kTruncated) << s.to_string();
  EXPECT_EQ(announced, big.size());
  s = p.finish(kRecv, 2, secs(10));
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(tx.get().ok());
  EXPECT_EQ(check_pattern(next_dst.data(), next_dst.size(), 9), SIZE_MAX);
  EXPECT_TRUE(lp.b->error().ok());
}

// Lists: a message gathered from pieces (empty ones too) and scattered over pieces cut elsewhere
// lands byte-exact; a recv list shorter than the message fails alone (kTruncated) and the next
// arrives; lists with no pieces, null pieces or (to send) device pieces are refused.
TEST(ShmLink, ListsGatherScatterAndTruncate) {
  LinkPair lp = make_threaded_pair({.slot_size = 4096, .slots = 4});
  ASSERT_TRUE(lp.a && lp.b);
  std::vector<uint8_t> src(30000), dst(30000, 0xEE), small(100);
  fill_pattern(src.data(), src.size(), std::random_device{}());
  std::vector<MemRegion> srcs = {{src.data() + 1, 5000, {}}, {src.data() + 6000, 0, {}}, {src.data() + 7001, 9999, {}}};
  std::vector<MemRegion> dsts = {{dst.data() + 20000, 7, {}}, {dst.data(), 14992, {}}};
  ASSERT_TRUE(lp.b->post_recv_list(1, dsts).ok());
  ASSERT_TRUE(lp.b->post_recv_list(2, {{small.data(), 60, {}}, {small.data() + 70, 30, {}}}).ok());
  ASSERT_TRUE(lp.b->post_recv(3, {dst.data() + 25000, 10, {}}).ok());
  ASSERT_TRUE(lp.a->post_send_list(1, srcs).ok());
  ASSERT_TRUE(lp.a->post_send_list(2, {{src.data(), 101, {}}}).ok());
  ASSERT_TRUE(lp.a->post_send(3, {src.data() + 29000, 10, {}}).ok());
  auto tx = std::async(std::launch::async, [&] {
    Pump p(lp.a.get());
    Status s;
    for (MsgId id : {1, 2, 3})
      if (s.ok()) s = p.finish(kSend, id, secs(10));
    return s;
  });
  Pump p(lp.b.get());
  size_t bytes = 0;
  Status s = p.finish(kRecv, 1, secs(10), &bytes);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(bytes, 14999u);
  EXPECT_EQ(p.finish(kRecv, 2, secs(10), &bytes).code(), Code::kTruncated);
  EXPECT_EQ(bytes, 101u);
  ASSERT_TRUE(p.finish(kRecv, 3, secs(10)).ok());
  ASSERT_TRUE(tx.get().ok());
  std::vector<uint8_t> sent(14999);  // the two source runs, in order
  std::copy(src.begin() + 1, src.begin() + 5001, sent.begin());
  std::copy(src.begin() + 7001, src.begin() + 17000, sent.begin() + 5000);
  EXPECT_TRUE(std::equal(sent.begin(), sent.begin() + 7, dst.begin() + 20000));
  EXPECT_TRUE(std::equal(sent.begin() + 7, sent.end(), dst.begin()));
  EXPECT_EQ(dst[14992], 0xEE);
  EXPECT_EQ(dst[20007], 0xEE);
  EXPECT_TRUE(std::equal(src.begin() + 29000, src.begin() + 29010, dst.begin() + 25000));
  EXPECT_TRUE(lp.b->error().ok());

  auto sim = Buffer::allocate({MemKind::kSim, 0}, 64);
  ASSERT_TRUE(sim.ok());
  EXPECT_EQ(lp.a->post_send_list(4, {}).code(), Code::kInvalidArgument);
  EXPECT_EQ(lp.a->post_send_list(4, {{nullptr, 5, {}}}).code(), Code::kInvalidArgument);
  EXPECT_EQ(lp.a->post_send_list(4, {{src.data(), 5, {}}, sim->region()}).code(), Code::kInvalidArgument);
  EXPECT_EQ(lp.b->post_recv_list(4, {}).code(), Code::kInvalidArgument);
  EXPECT_EQ(lp.b->post_recv_list(4, {{nullptr, 5, {}}}).code(), Code::kInvalidArgument);
  EXPECT_EQ(lp.b->pending(), 0u);
}

TEST(ShmLink, DuplicateRecvIdIsRejected) {
  LinkPair lp = make_threaded_pair();
  ASSERT_TRUE(lp.a && lp.b);
  char buf[8];
  ASSERT_TRUE(lp.b->post_recv(5, {buf, 8, {}}).ok());
  EXPECT_EQ(lp.b->post_recv(5, {buf, 8, {}}).code(), Code::kInvalidArgument);
}

// Runs `side` in a child process on one end of a link and `parent` here on the other.
void run_in_two_processes(const LinkOptions& options, const std::function<int(ShmLink&)>& child_side,
                          const std::function<void(ShmLink&)>& parent_side) {
  auto p = UnixChannel::pair();
  ASSERT_TRUE(p.ok());
  pid_t child = testing::fork_child([&] {
    { UnixChannel drop = std::move(p->first); }
    auto link = ShmLink::accept(std::move(p->second), secs(10));
    if (!link.ok()) return 50;
    return child_side(**link);
  });
  { UnixChannel drop = std::move(p->second); }
  auto link = ShmLink::create(std::move(p->first), options, secs(10));
  ASSERT_TRUE(link.ok()) << link.status().to_string();
  EXPECT_EQ((*link)->peer_name(), "pid " + std::to_string(child));
  parent_side(**link);
  EXPECT_EQ(testing::wait_child(child), 0);
}

// Each side sends kOps messages of sizes derived from the id and receives kOps, all posted at
// once, the recvs in reverse order; everything is checked byte for byte.
int exchange(ShmLink& link, uint64_t my_seed, uint64_t peer_seed, int ops) {
  auto size_of = [](uint64_t seed, int i) { return size_t((seed * 7919 + i * 104729) % (3 << 20)) + (i % 3); };
  std::vector<std::vector<uint8_t>> out(ops), in(ops);
  for (int i = ops - 1; i >= 0; --i) {
    in[i].resize(size_of(peer_seed, i) + 1);
    if (!link.post_recv(peer_seed * 1000 + i, {in[i].data() + 1, in[i].size() - 1, {}}).ok()) return 10;
  }
  for (int i = 0; i < ops; ++i) {
    out[i].resize(size_of(my_seed, i));
    fill_pattern(out[i].data(), out[i].size(), my_seed * 1000 + i);
    if (!link.post_send(my_seed * 1000 + i, {out[i].data(), out[i].size(), {}}).ok()) return 11;
  }
  Pump pump(&link);
  for (int i = 0; i < ops; ++i) {
    if (!pump.finish(kSend, my_seed * 1000 + i, secs(60)).ok()) return 12;
    size_t bytes = 0;
    if (!pump.finish(kRecv, peer_seed * 1000 + i, secs(60), &bytes).ok()) return 13;
    if (bytes != in[i].size() - 1) return 14;
    if (check_pattern(in[i].data() + 1, bytes, peer_seed * 1000 + i) != SIZE_MAX) return 15;
  }
  return link.pending() == 0 ? 0 : 16;
}

TEST(ShmLink, ManyOpsBothDirectionsAtOnceTwoProcesses) {
  run_in_two_processes({.slot_size = 64 * 1024, .slots = 8}, [](ShmLink& l) { return exchange(l, 2, 1, 48); },
                       [](ShmLink& l) { EXPECT_EQ(exchange(l, 1, 2, 48), 0); });
}

TEST(ShmLink, LargeOddMessageTwoProcesses) {
  const size_t n = (64 << 20) + 3;
  run_in_two_processes(
      {},
      [n](ShmLink& l) {
        std::vector<uint8_t> dst(n + 5);
        if (!l.post_recv(77, {dst.data() + 5, n, {}}).ok()) return 1;
        Pump p(&l);
        if (!p.finish(kRecv, 77, secs(60)).ok()) return 2;
        return check_pattern(dst.data() + 5, n, 77) == SIZE_MAX ? 0 : 3;
      },
      [n](ShmLink& l) {
        std::vector<uint8_t> src(n + 1);
        fill_pattern(src.data() + 1, n, 77);
        ASSERT_TRUE(l.post_send(77, {src.data() + 1, n, {}}).ok());
        Pump p(&l);
        Status s = p.finish(kSend, 77, secs(60));
        EXPECT_TRUE(s.ok()) << s.to_string();
      });
}

// Device memory on both ends (the simulated device: only its copy queue may touch it), staged
// through the slots, with host on one end too.
TEST(ShmLink, SimDeviceStagedThroughSlots) {
  LinkPair lp = make_threaded_pair({.slot_size = 64 * 1024, .slots = 4});
  ASSERT_TRUE(lp.a && lp.b);
  const MemSpec sim{MemKind::kSim, 0}, host{};
  MsgId id = 1;
  for (auto [from, to] : {std::pair{sim, sim}, {host, sim}, {sim, host}}) {
    for (size_t n : {size_t(1), size_t(4097), size_t(5 << 20) + 1}) {
      auto src = Buffer::allocate(from, n + 3);
      auto dst = Buffer::allocate(to, n + 5);
      ASSERT_TRUE(src.ok() && dst.ok());
      std::vector<uint8_t> pattern(n), back(n);
      fill_pattern(pattern.data(), n, id);
      ASSERT_TRUE(copy_memory(src->region().sub(3, n), {pattern.data(), n, {}}).ok());
      ASSERT_TRUE(lp.b->post_recv(id, dst->region().sub(5, n)).ok());
      ASSERT_TRUE(lp.a->post_send(id, src->region().sub(3, n)).ok());
      auto rx = std::async(std::launch::async, [&] { return Pump(lp.b.get()).finish(kRecv, id, secs(30)); });
      Status s = Pump(lp.a.get()).finish(kSend, id, secs(30));
      ASSERT_TRUE(s.ok()) << s.to_string();
      s = rx.get();
      ASSERT_TRUE(s.ok()) << s.to_string();
      ASSERT_TRUE(copy_memory({back.data(), n, {}}, dst->region().sub(5, n)).ok());
      EXPECT_EQ(check_pattern(back.data(), n, id), SIZE_MAX) << n;
      ++id;
    }
  }
  EXPECT_GT(lp.a->stats().device_copies, 0u);
  EXPECT_GT(lp.b->stats().device_copies, 0u);
}

TEST(ShmLink, SetupValidatesOptions) {
  auto p = UnixChannel::pair();
  ASSERT_TRUE(p.ok());
  auto l = ShmLink::create(std::move(p->first), {.slot_size = 100, .slots = 4}, secs(1));
  EXPECT_EQ(l.status().code(), Code::kInvalidArgument);
  auto q = UnixChannel::pair();
  l = ShmLink::create(std::move(q->first), {.slot_size = 4096, .slots = 1}, secs(1));
  EXPECT_EQ(l.status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace dmx::shm

namespace dmx::shm {
namespace {

TEST(ShmLink, OptionsFromTheConfigTable) {
  auto c = Config::resolve(Options().set("shm_slots", "8").set("shm_slot_size", "1M").set("shm_spin", "10us"));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto o = link_options(*c);
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->slots, 8u);
  EXPECT_EQ(o->slot_size, 1u << 20);
  EXPECT_EQ(o->spin, std::chrono::microseconds(10));
  EXPECT_EQ(o->nt_receive_min, kBulkMessage);  // nt_receive_min's default
  c = Config::resolve(Options().set("nt_receive_min", "2M"));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(link_options(*c)->nt_receive_min, 2u << 20);
  c = Config::resolve(Options().set("nt_receive_min", "0"));  // never
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(link_options(*c)->nt_receive_min, UINT64_MAX);
  c = Config::resolve(Options().set("shm_slots", "1"));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(link_options(*c).status().code(), Code::kInvalidArgument);
  c = Config::resolve(Options().set("shm_slot_size", "100"));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(link_options(*c).status().code(), Code::kInvalidArgument);
}

// shm_copy_threads = 0: the link's thread alone on a small machine, a crew where cores are spare.
TEST(ShmLink, AutomaticCopyThreadsFollowTheCpus) {
  for (unsigned cpus : {0u, 1u, 3u}) EXPECT_EQ(CopyCrew::automatic_threads(cpus), 1) << cpus;
  for (unsigned cpus : {4u, 7u}) EXPECT_EQ(CopyCrew::automatic_threads(cpus), 2) << cpus;
  for (unsigned cpus : {8u, 16u, 32u, 128u}) EXPECT_EQ(CopyCrew::automatic_threads(cpus), 4) << cpus;
  auto c = Config::resolve(Options().set("shm_copy_threads", "3"));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(link_options(*c)->copy_threads, 3);
  c = Config::resolve(Options());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(link_options(*c)->copy_threads, CopyCrew::automatic_threads(usable_cpus()));
}

}  // namespace
}  // namespace dmx::shm

namespace dmx::shm {
namespace {

// post_discard: the message is consumed from the ring without a copy (several ring's worth, and
// 0 B), and the message after it arrives intact.
TEST(ShmLink, DiscardConsumesWithoutCopyingAndTheNextArrives) {
  LinkPair lp = make_threaded_pair({.slot_size = 4096, .slots = 4});
  ASSERT_TRUE(lp.a && lp.b);
  std::vector<uint8_t> big(5 * 4 * 4096 + 11), next(9000), next_dst(9000);
  fill_pattern(big.data(), big.size(), 1);
  fill_pattern(next.data(), next.size(), 3);
  ASSERT_TRUE(lp.b->post_discard(1, big.size()).ok());
  ASSERT_TRUE(lp.b->post_discard(2, 0).ok());
  ASSERT_TRUE(lp.b->post_recv(3, {next_dst.data(), next_dst.size(), {}}).ok());
  EXPECT_EQ(lp.b->post_discard(3, 5).code(), Code::kInvalidArgument);  // id already posted
  ASSERT_TRUE(lp.a->post_send(1, {big.data(), big.size(), {}}).ok());
  ASSERT_TRUE(lp.a->post_send(2, {nullptr, 0, {}}).ok());
  ASSERT_TRUE(lp.a->post_send(3, {next.data(), next.size(), {}}).ok());
  auto tx = std::async(std::launch::async, [&] {
    Pump p(lp.a.get());
    for (MsgId id : {1, 2, 3}) DMX_RETURN_IF_ERROR(p.finish(kSend, id, secs(10)));
    return Status();
  });
  Pump p(lp.b.get());
  size_t bytes = 0;
  Status s = p.finish(kRecv, 1, secs(10), &bytes);
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(bytes, big.size());
  s = p.finish(kRecv, 2, secs(10), &bytes);
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(bytes, 0u);
  s = p.finish(kRecv, 3, secs(10));
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(tx.get().ok());
  EXPECT_EQ(check_pattern(next_dst.data(), next_dst.size(), 3), SIZE_MAX);
  EXPECT_EQ(lp.b->stats().host_copies, (next.size() + 4095) / 4096);  // only the kept message
  EXPECT_TRUE(lp.b->error().ok());
}

// A discard of N bytes checks the message is exactly N bytes: shorter or longer is kProtocol.
TEST(ShmLink, DiscardOfAnotherLengthIsAProtocolError) {
  for (size_t announced : {size_t(4000), size_t(6000)}) {
    LinkPair lp = make_threaded_pair({.slot_size = 4096, .slots = 4});
    ASSERT_TRUE(lp.a && lp.b);
    std::vector<uint8_t> src(5000);
    ASSERT_TRUE(lp.b->post_discard(1, announced).ok());
    ASSERT_TRUE(lp.a->post_send(1, {src.data(), src.size(), {}}).ok());
    auto tx = std::async(std::launch::async, [&] { return Pump(lp.a.get()).finish(kSend, 1, secs(10)); });
    Status s = Pump(lp.b.get()).finish(kRecv, 1, secs(10));
    EXPECT_EQ(s.code(), Code::kProtocol) << s.to_string();
    EXPECT_NE(s.message().find("announced as"), std::string::npos) << s.to_string();
    EXPECT_FALSE(lp.b->error().ok());
    EXPECT_TRUE(tx.get().ok());  // both chunks fit in the ring: the send itself completed
  }
}

// check_peer fails even an idle link once the peer is gone, so that error() says why; a live peer
// leaves it alone.
TEST(ShmLink, CheckPeerFailsAnIdleLinkWhenThePeerIsGone) {
  LinkPair lp = make_threaded_pair();
  ASSERT_TRUE(lp.a && lp.b);
  std::vector<Completion> out;
  EXPECT_TRUE(lp.a->check_peer(&out).ok());
  EXPECT_TRUE(lp.a->error().ok());
  lp.b.reset();
  Status s = lp.a->check_peer(&out);
  EXPECT_EQ(s.code(), Code::kPeerFailed) << s.to_string();
  EXPECT_EQ(lp.a->error().code(), Code::kPeerFailed);
  EXPECT_TRUE(out.empty());
}

}  // namespace
}  // namespace dmx::shm
