// The cuda_ipc path's fd side channel (transport/cuda_ipc/ipc_fds.h), without GPUs: fds of any kind (memfds
// here) stand in for the fds of cuMem allocations. Every message from the peer is untrusted.
#include "transport/cuda_ipc/ipc_fds.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "test_env.h"

namespace dmx {
namespace {

UniqueFd memfd() {
  UniqueFd fd(::memfd_create("dmx-ipc-fds-test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  return fd;
}

ino_t inode(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return st.st_ino;
}

struct Pair {
  std::unique_ptr<IpcFdChannel> a, b;  // a sends, b receives (either could do both)
  UnixChannel raw;                     // the other end of b's socket, for hand-made messages
};

Pair make_pair() {
  Pair p;
  auto ab = UnixChannel::pair();
  EXPECT_TRUE(ab.ok()) << ab.status().to_string();
  p.a = std::make_unique<IpcFdChannel>(std::move(ab->first), "peer a");
  p.b = std::make_unique<IpcFdChannel>(std::move(ab->second), "peer b");
  return p;
}

// b receives hand-made messages from `raw`.
Pair raw_pair() {
  Pair p;
  auto ab = UnixChannel::pair();
  EXPECT_TRUE(ab.ok()) << ab.status().to_string();
  p.raw = std::move(ab->first);
  p.b = std::make_unique<IpcFdChannel>(std::move(ab->second), "peer b");
  return p;
}

std::array<std::byte, 16> message(uint32_t magic, uint32_t version, uint64_t id) {
  std::array<std::byte, 16> m{};
  std::memcpy(m.data(), &magic, 4);
  std::memcpy(m.data() + 4, &version, 4);
  std::memcpy(m.data() + 8, &id, 8);
  return m;
}
constexpr uint32_t kMagic = 0x46786d64;

TEST(IpcFdChannel, FdsArriveAndAreFoundInAnyOrder) {
  Pair p = make_pair();
  UniqueFd f[3] = {memfd(), memfd(), memfd()};
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(p.a->sent(5 + i));
    ASSERT_TRUE(p.a->send(5 + i, f[i].get()).ok());
    EXPECT_TRUE(p.a->sent(5 + i));
  }
  auto seven = p.b->fd_for(7);
  ASSERT_TRUE(seven.ok()) << seven.status().to_string();
  EXPECT_EQ(inode(*seven), inode(f[2].get()));  // the same file, as a new fd
  EXPECT_NE(*seven, f[2].get());
  EXPECT_EQ(p.b->held(), 3u);  // 5 and 6 were read on the way
  auto five = p.b->fd_for(5);
  ASSERT_TRUE(five.ok());
  EXPECT_EQ(inode(*five), inode(f[0].get()));
  EXPECT_EQ(*p.b->fd_for(5), *five);  // held, not received again

  p.b->forget(6);
  EXPECT_EQ(p.b->held(), 2u);
  const uint64_t retired[] = {5};
  p.a->retire_sent(retired);
  EXPECT_FALSE(p.a->sent(5));
  EXPECT_TRUE(p.a->sent(6));
}

// An allocation this side never needed is retired: its queued fd is taken and closed, not held.
TEST(IpcFdChannel, ForgetTakesAnFdThatWasNeverAskedFor) {
  Pair p = make_pair();
  UniqueFd f = memfd();
  ASSERT_TRUE(p.a->send(1, f.get()).ok());
  p.b->forget(1);
  EXPECT_EQ(p.b->held(), 0u);
  ASSERT_TRUE(p.a->send(2, f.get()).ok());
  ASSERT_TRUE(p.b->fd_for(2).ok());
  EXPECT_EQ(p.b->held(), 1u);
}

TEST(IpcFdChannel, AnFdThatNeverComesFailsAtItsDeadline) {
  Pair p = make_pair();
  auto t0 = Clock::now();
  auto r = p.b->fd_for(42);
  EXPECT_EQ(r.status().code(), Code::kProtocol);
  EXPECT_NE(r.status().message().find("allocation 42 did not come"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().to_string().find("peer b"), std::string::npos) << r.status().to_string();
  EXPECT_LT(Clock::now() - t0, test::kLoadSlack);  // IpcFdChannel::kArrivalWait, not for ever
}

// Malformed messages, id 0, an id twice, a message without its fd: kProtocol naming the peer, and
// the channel stays failed (later asks get the same answer).
TEST(IpcFdChannel, BadMessagesFailTheChannel) {
  struct Case {
    const char* name;
    std::vector<std::byte> bytes;
    int fds;
    const char* says;
  };
  auto m = [](uint32_t magic, uint32_t version, uint64_t id) {
    auto a = message(magic, version, id);
    return std::vector<std::byte>(a.begin(), a.end());
  };
  std::vector<Case> cases = {
      {"short", std::vector<std::byte>(8), 1, "malformed"},
      {"magic", m(0x12345678, 1, 3), 1, "malformed"},
      {"version", m(kMagic, 2, 3), 1, "malformed"},
      {"id 0", m(kMagic, 1, 0), 1, "id 0"},
      {"no fd", m(kMagic, 1, 3), 0, "fds"},
      {"two fds", m(kMagic, 1, 3), 2, "fds"},
  };
  for (const Case& c : cases) {
    Pair p = raw_pair();
    UniqueFd f = memfd();
    int fds[2] = {f.get(), f.get()};
    ASSERT_TRUE(p.raw.send(c.bytes, std::span<const int>(fds, static_cast<size_t>(c.fds)), Deadline::never()).ok());
    auto r = p.b->fd_for(3);
    EXPECT_EQ(r.status().code(), Code::kProtocol) << c.name << ": " << r.status().to_string();
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << c.name << ": " << r.status().to_string();
    EXPECT_EQ(p.b->fd_for(3).status().code(), Code::kProtocol) << c.name;
    EXPECT_EQ(p.b->held(), 0u) << c.name;
  }
  Pair p = raw_pair();
  UniqueFd f = memfd();
  int fd = f.get();
  for (int i = 0; i < 2; ++i)
    ASSERT_TRUE(p.raw.send(message(kMagic, 1, 9), std::span<const int>(&fd, 1), Deadline::never()).ok());
  EXPECT_TRUE(p.b->fd_for(9).ok());  // found before the second one is read
  auto r = p.b->fd_for(10);
  EXPECT_NE(r.status().message().find("came twice"), std::string::npos) << r.status().to_string();
}

TEST(IpcFdChannel, PeerGone) {
  Pair p = make_pair();
  UniqueFd f = memfd();
  ASSERT_TRUE(p.a->send(1, f.get()).ok());
  p.a.reset();
  EXPECT_TRUE(p.b->fd_for(1).ok());  // what came before is still there
  EXPECT_EQ(p.b->fd_for(2).status().code(), Code::kPeerFailed);
  Pair q = make_pair();
  q.b.reset();
  EXPECT_EQ(q.a->send(1, f.get()).code(), Code::kPeerFailed);
  EXPECT_FALSE(q.a->sent(1));
}

}  // namespace
}  // namespace dmx
