// Faults on the shm link: the peer killed (-9) mid-transfer, a peer that writes garbage into the
// shared ring, a peer that dies before setup. Every pending operation must fail within a bound
// with an error naming the peer; nothing may hang or touch memory out of bounds.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>

#include <future>

#include "transport/transport_test_util.h"
#include "test_env.h"

namespace dmx::shm {
namespace {

using testing::Pump;
using testing::secs;

constexpr auto kSend = Completion::kSend;
constexpr auto kRecv = Completion::kRecv;
constexpr auto kBound = test::kLoadSlack;  // how fast a survivor must learn of the death (a bug: never)

struct Forked {
  pid_t child = -1;
  std::unique_ptr<ShmLink> link;
};

// A child that accepts the link, runs `body` on it, then stays alive until killed.
Forked fork_peer(const LinkOptions& options, const std::function<void(ShmLink&)>& body, int ready_pipe_w) {
  auto p = UnixChannel::pair();
  Forked f;
  f.child = testing::fork_child([&] {
    { UnixChannel drop = std::move(p->first); }
    auto link = ShmLink::accept(std::move(p->second), secs(10));
    if (!link.ok()) return 50;
    body(**link);
    char c = 'r';
    if (ready_pipe_w >= 0) (void)!::write(ready_pipe_w, &c, 1);
    for (;;) ::pause();
  });
  { UnixChannel drop = std::move(p->second); }
  auto link = ShmLink::create(std::move(p->first), options, secs(10));
  EXPECT_TRUE(link.ok()) << link.status().to_string();
  if (link.ok()) f.link = std::move(*link);
  return f;
}

void expect_peer_failure(const Status& s, pid_t child) {
  EXPECT_EQ(s.code(), Code::kPeerFailed) << s.to_string();
  EXPECT_NE(s.to_string().find("pid " + std::to_string(child)), std::string::npos) << s.to_string();
}

TEST(ShmFault, ReceiverKilledMidTransferFailsTheSend) {
  // The child never consumes: the ring fills, the send is mid-way when the child dies.
  Forked f = fork_peer({.slot_size = 64 * 1024, .slots = 4}, [](ShmLink&) {}, -1);
  ASSERT_TRUE(f.link);
  std::vector<uint8_t> src(8 << 20);
  ASSERT_TRUE(f.link->post_send(1, {src.data(), src.size(), {}}).ok());
  ASSERT_TRUE(f.link->post_send(2, {src.data(), 10, {}}).ok());
  std::vector<Completion> out;
  f.link->progress(&out);
  EXPECT_TRUE(out.empty());
  ::kill(f.child, SIGKILL);
  auto t0 = Clock::now();
  Pump pump(f.link.get());
  expect_peer_failure(pump.finish(kSend, 1, secs(10)), f.child);
  expect_peer_failure(pump.finish(kSend, 2, secs(10)), f.child);
  EXPECT_LT(Clock::now() - t0, kBound);
  EXPECT_EQ(f.link->pending(), 0u);
  // Sticky: a later operation completes (once) with the same error.
  ASSERT_TRUE(f.link->post_recv(3, {src.data(), 10, {}}).ok());
  expect_peer_failure(pump.finish(kRecv, 3, secs(1)), f.child);
  testing::wait_child(f.child);
}

TEST(ShmFault, SenderKilledMidTransferFailsTheRecv) {
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  static std::vector<uint8_t> src(32 << 20, 0x5A);  // allocated before fork, used by the child
  Forked f = fork_peer(
      {.slot_size = 64 * 1024, .slots = 4},
      [](ShmLink& l) {
        (void)l.post_send(1, {src.data(), src.size(), {}});
        std::vector<Completion> out;
        for (int i = 0; i < 100; ++i) l.progress(&out);  // fill the ring, then report ready
      },
      pipefd[1]);
  ASSERT_TRUE(f.link);
  std::vector<uint8_t> dst(src.size());
  ASSERT_TRUE(f.link->post_recv(1, {dst.data(), dst.size(), {}}).ok());
  char c;
  ASSERT_EQ(::read(pipefd[0], &c, 1), 1);
  std::vector<Completion> out;
  for (int i = 0; i < 3; ++i) f.link->progress(&out);  // take some chunks: mid-transfer
  EXPECT_TRUE(out.empty());
  ::kill(f.child, SIGKILL);
  auto t0 = Clock::now();
  Pump pump(f.link.get());
  expect_peer_failure(pump.finish(kRecv, 1, secs(10)), f.child);
  EXPECT_LT(Clock::now() - t0, kBound);
  testing::wait_child(f.child);
  ::close(pipefd[0]);
  ::close(pipefd[1]);
}

TEST(ShmFault, PeerThatExitsAfterSendingStillDelivers) {
  // A send completes once its bytes are in the ring; the sender may then exit. The receiver
  // must get the message, not a peer failure.
  auto p = UnixChannel::pair();
  ASSERT_TRUE(p.ok());
  pid_t child = testing::fork_child([&] {
    { UnixChannel drop = std::move(p->first); }
    auto link = ShmLink::accept(std::move(p->second), secs(10));
    if (!link.ok()) return 1;
    std::vector<uint8_t> src(100000);
    testing::fill_pattern(src.data(), src.size(), 3);
    (void)(*link)->post_send(3, {src.data(), src.size(), {}});
    return Pump(link->get()).finish(kSend, 3, secs(10)).ok() ? 0 : 2;
  });
  { UnixChannel drop = std::move(p->second); }
  auto link = ShmLink::create(std::move(p->first), {}, secs(10));
  ASSERT_TRUE(link.ok());
  ASSERT_EQ(testing::wait_child(child), 0);  // the child has exited before we read anything
  std::vector<uint8_t> dst(100000);
  ASSERT_TRUE((*link)->post_recv(3, {dst.data(), dst.size(), {}}).ok());
  Status s = Pump(link->get()).finish(kRecv, 3, secs(10));
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(testing::check_pattern(dst.data(), dst.size(), 3), SIZE_MAX);
}

TEST(ShmFault, PeerDeadBeforeSetupIsAnErrorNotAHang) {
  auto p = UnixChannel::pair();
  ASSERT_TRUE(p.ok());
  pid_t child = testing::fork_child([] { return 0; });
  ASSERT_EQ(testing::wait_child(child), 0);
  { UnixChannel drop = std::move(p->second); }
  auto t0 = Clock::now();
  auto link = ShmLink::create(std::move(p->first), {}, secs(10));
  EXPECT_FALSE(link.ok());
  EXPECT_LT(Clock::now() - t0, kBound);
}

// Both ends in this process; the test scribbles over what the "peer" controls.
struct Pair {
  std::unique_ptr<ShmLink> a, b;
};
Pair make_pair(LinkOptions options) {
  auto p = UnixChannel::pair();
  auto fut = std::async(std::launch::async, [&] { return ShmLink::accept(std::move(p->second), secs(10)); });
  auto a = ShmLink::create(std::move(p->first), options, secs(10));
  auto b = fut.get();
  if (!a.ok() || !b.ok()) return {};
  return {std::move(*a), std::move(*b)};
}

TEST(ShmFault, CorruptRingHeadIsAProtocolError) {
  Pair lp = make_pair({.slot_size = 4096, .slots = 4});
  ASSERT_TRUE(lp.a && lp.b);
  std::vector<uint8_t> dst(4096);
  ASSERT_TRUE(lp.b->post_recv(1, {dst.data(), dst.size(), {}}).ok());
  auto* head = static_cast<std::atomic<uint64_t>*>(lp.b->debug_rx_ring_control());
  head->store(1000);  // 1000 slots "published" in a ring of 4
  Status s = Pump(lp.b.get()).finish(kRecv, 1, secs(5));
  EXPECT_EQ(s.code(), Code::kProtocol) << s.to_string();
  EXPECT_NE(s.message().find("ring corrupt"), std::string::npos) << s.to_string();
  EXPECT_FALSE(lp.b->error().ok());
}

TEST(ShmFault, CorruptSlotHeadersAreProtocolErrors) {
  // Each case: a slot header a malicious producer could write, published with head = 1.
  struct Case {
    const char* what;
    uint64_t id, offset, total, len;
  };
  for (const Case& c : {Case{"len over slot", 1, 0, 1 << 20, 1 << 20}, Case{"offset past total", 1, 9000, 100, 10},
                        Case{"len past total", 1, 0, 100, 200}, Case{"first chunk not at 0", 1, 4096, 1 << 20, 4096},
                        Case{"huge values", 1, ~0ull - 5, ~0ull, 4096}}) {
    Pair lp = make_pair({.slot_size = 4096, .slots = 4});
    ASSERT_TRUE(lp.a && lp.b);
    std::vector<uint8_t> dst(1 << 20);
    ASSERT_TRUE(lp.b->post_recv(1, {dst.data(), dst.size(), {}}).ok());
    auto* h = static_cast<std::atomic<uint64_t>*>(lp.b->debug_rx_slot_header(0));
    h[0] = c.id;
    h[1] = c.offset;
    h[2] = c.total;
    h[3] = c.len;
    static_cast<std::atomic<uint64_t>*>(lp.b->debug_rx_ring_control())->store(1);
    Status s = Pump(lp.b.get()).finish(kRecv, 1, secs(5));
    EXPECT_EQ(s.code(), Code::kProtocol) << c.what << ": " << s.to_string();
  }
}

TEST(ShmFault, CorruptTailIsAProtocolErrorForTheSender) {
  Pair lp = make_pair({.slot_size = 4096, .slots = 4});
  ASSERT_TRUE(lp.a && lp.b);
  // The sender reads the tail of its tx ring = the receiver's rx ring: its second word.
  auto* ctl = static_cast<std::atomic<uint64_t>*>(lp.b->debug_rx_ring_control());
  ctl[8].store(77);  // tail at +64 B: 77 slots released, none were published
  std::vector<uint8_t> src(100);
  ASSERT_TRUE(lp.a->post_send(1, {src.data(), src.size(), {}}).ok());
  Status s = Pump(lp.a.get()).finish(kSend, 1, secs(5));
  EXPECT_EQ(s.code(), Code::kProtocol) << s.to_string();
}

}  // namespace
}  // namespace dmx::shm

namespace dmx::shm {
namespace {

// A "creator" that sends a pipe where the doorbell eventfd belongs, and a region that is not
// sealed: accept() must refuse both with kProtocol, not map or write to them.
TEST(ShmFault, SetupRejectsForgedFds) {
  struct Hello {
    uint64_t magic;
    uint32_t version, slots;
    uint64_t slot_size, total_size;
  };
  for (bool seal : {false, true}) {
    auto p = UnixChannel::pair();
    ASSERT_TRUE(p.ok());
    uint32_t slots = 4;
    size_t slot = 4096;
    // The layout size as compute_layout makes it: header page, control, headers, page-aligned data.
    size_t data = 4096 + 64 * 2 + 128 * 2 + 2 * slots * 64;
    data = (data + 4095) / 4096 * 4096;
    size_t total = data + 2 * slots * slot;
    UniqueFd mem(::memfd_create("forged", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    ASSERT_EQ(::ftruncate(mem.get(), static_cast<off_t>(total)), 0);
    void* m = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, mem.get(), 0);
    ASSERT_NE(m, MAP_FAILED);
    uint64_t hdr[4] = {0x646d782d73686d31ull, uint64_t(1) | (uint64_t(slots) << 32), slot, total};
    std::memcpy(m, hdr, sizeof hdr);
    ::munmap(m, total);
    if (seal) {
      ASSERT_EQ(::fcntl(mem.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    }
    int pipefd[2];
    ASSERT_EQ(::pipe(pipefd), 0);
    UniqueFd r(pipefd[0]), w(pipefd[1]);
    Hello h{0x646d782d73686d31ull, 1, slots, slot, total};
    int fds[2] = {mem.get(), w.get()};
    ASSERT_TRUE(p->first.send({reinterpret_cast<std::byte*>(&h), sizeof h}, fds, secs(5)).ok());
    auto link = ShmLink::accept(std::move(p->second), secs(5));
    ASSERT_FALSE(link.ok()) << "seal=" << seal;
    EXPECT_EQ(link.status().code(), Code::kProtocol) << link.status().to_string();
    EXPECT_NE(link.status().message().find(seal ? "not an eventfd" : "not sealed"), std::string::npos)
        << link.status().to_string();
  }
}

}  // namespace
}  // namespace dmx::shm
