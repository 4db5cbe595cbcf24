// The shm pipe: byte-exact streams both ways with random sizes and many wrap-arounds, the
// doorbells (full ring, room, data, shutdown), a peer killed mid-stream (busy-polling and asleep),
// a peer that corrupts the counters or forges the region, and a printed ping-pong latency.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <future>
#include <random>
#include <string>
#include <thread>

#include "transport/transport_test_util.h"
#include "test_env.h"

namespace dmx::shm {
namespace {

using std::chrono::milliseconds;
using testing::secs;

constexpr auto kBound = test::kLoadSlack;  // how fast a survivor must learn of a death (a bug: never)

struct PipePair {
  std::unique_ptr<ShmPipe> a, b;  // a created, b accepted
};

PipePair make_pair(size_t ring_bytes) {
  auto p = UnixChannel::pair();
  EXPECT_TRUE(p.ok());
  if (!p.ok()) return {};
  auto fut = std::async(std::launch::async, [&] { return ShmPipe::accept(std::move(p->second), secs(10)); });
  auto a = ShmPipe::create(std::move(p->first), {.ring_bytes = ring_bytes}, secs(10));
  auto b = fut.get();
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  if (!a.ok() || !b.ok()) return {};
  return {std::move(*a), std::move(*b)};
}

Result<size_t> write_bytes(ShmPipe& p, const void* src, size_t n) {
  iovec v{const_cast<void*>(src), n};
  return p.write({&v, 1});
}

// arm(), poll the pipe's fds, disarm(). -1: arm() said there is something to do; else poll's result.
int sleep_on(ShmPipe& p, bool want_room, int timeout_ms, pollfd* fired = nullptr) {
  if (!p.arm(want_room)) return -1;
  pollfd fds[2];
  int n = p.pollfds(fds);
  int r = ::poll(fds, static_cast<nfds_t>(n), timeout_ms);
  p.disarm();
  if (fired) std::copy(fds, fds + n, fired);
  return r;
}

uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) | rd();
}

std::vector<uint8_t> random_bytes_of(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// One end of a duplex transfer, as the engine's worker drives it: non-blocking writes and reads of
// random sizes, and when neither moves for a while, sleeping on the doorbell. A sleep that times
// out while the transfer is unfinished is a lost wakeup. Returns "" or what went wrong.
std::string duplex_end(ShmPipe& p, const std::vector<uint8_t>& out, std::vector<uint8_t>* in, size_t ring,
                       uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto size = [&]() -> size_t {
    switch (rng() % 4) {
      case 0:
        return 1;
      case 1:
        return 1 + rng() % 64;
      case 2:
        return 1 + rng() % ring;
      default:
        return 1 + rng() % (3 * ring);  // larger than the ring
    }
  };
  auto broken = [&](std::string what) {
    p.shutdown();  // so that the other end fails at once instead of waiting for us
    return what;
  };
  size_t sent = 0, got = 0, idle = 0;
  while (sent < out.size() || got < in->size()) {
    bool moved = false;
    if (sent < out.size()) {
      iovec v[3];
      size_t count = 1 + rng() % 3, at = sent;
      for (size_t i = 0; i < count; ++i) {
        size_t len = std::min(size(), out.size() - at);
        v[i] = iovec{const_cast<uint8_t*>(out.data()) + at, len};
        at += len;
      }
      auto w = p.write({v, count});
      if (!w.ok()) return broken("write: " + w.status().to_string());
      sent += *w;
      moved |= *w != 0;
    }
    if (got < in->size()) {
      auto r = p.read(in->data() + got, std::min(size(), in->size() - got));
      if (!r.ok()) return broken("read: " + r.status().to_string());
      got += *r;
      moved |= *r != 0;
    }
    if (moved) {
      idle = 0;
    } else if (++idle > rng() % 300) {
      if (sleep_on(p, /*want_room=*/sent < out.size(), 5000) == 0)
        return broken("lost wakeup: slept 5 s with " + std::to_string(sent) + " B sent, " + std::to_string(got) +
                      " B read");
      idle = 0;
    }
  }
  return {};
}

TEST(ShmPipe, RandomSizesBothWaysAtOnceAreByteExact) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (size_t ring : {size_t{4096}, size_t{64 << 10}}) {
    PipePair pp = make_pair(ring);
    ASSERT_TRUE(pp.a && pp.b);
    // Odd totals, hundreds of wrap-arounds of the small ring.
    auto a_out = random_bytes_of((3 << 20) + 12345, seed), b_out = random_bytes_of((2 << 20) + 777, seed + 1);
    std::vector<uint8_t> a_in(b_out.size()), b_in(a_out.size());
    auto fut = std::async(std::launch::async, [&] { return duplex_end(*pp.b, b_out, &b_in, ring, seed + 2); });
    std::string ea = duplex_end(*pp.a, a_out, &a_in, ring, seed + 3);
    std::string eb = fut.get();
    EXPECT_EQ(ea, "");
    EXPECT_EQ(eb, "");
    EXPECT_TRUE(a_in == b_out) << "ring " << ring;
    EXPECT_TRUE(b_in == a_out) << "ring " << ring;
    EXPECT_TRUE(pp.a->error().ok() && pp.b->error().ok());
    std::printf("ring %zu B: %lu + %lu doorbell rings\n", ring, pp.a->wakeups_sent(), pp.b->wakeups_sent());
  }
}

TEST(ShmPipe, FullRingWritesZeroAndFreedRoomWakesTheArmedWriter) {
  PipePair pp = make_pair(4096);
  ASSERT_TRUE(pp.a && pp.b);
  std::vector<uint8_t> src(5000, 7), dst(5000);
  auto w = write_bytes(*pp.a, src.data(), src.size());
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(*w, 4096u);
  w = write_bytes(*pp.a, src.data(), 1);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(*w, 0u);
  ASSERT_TRUE(pp.a->arm(/*want_room=*/true));  // no data for a, no room: may sleep
  pollfd fds[2];
  int n = pp.a->pollfds(fds);
  ASSERT_EQ(n, 2);
  EXPECT_EQ(::poll(fds, n, 0), 0);
  std::thread reader([&] {
    std::this_thread::sleep_for(milliseconds(50));
    auto r = pp.b->read(dst.data(), 100);
    EXPECT_TRUE(r.ok() && *r == 100);
  });
  auto t0 = Clock::now();
  EXPECT_EQ(::poll(fds, n, 60'000), 1);
  EXPECT_TRUE(fds[0].revents & POLLIN);
  EXPECT_LT(Clock::now() - t0, kBound);
  pp.a->disarm();
  reader.join();
  EXPECT_EQ(pp.b->wakeups_sent(), 1u);
  w = write_bytes(*pp.a, src.data(), 1000);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(*w, 100u);
  // Room or data already there: arm() says so, and a disarmed doorbell was drained.
  auto r = pp.b->read(dst.data(), 1);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(pp.a->arm(/*want_room=*/true));
  EXPECT_FALSE(pp.b->arm(/*want_room=*/false));
  EXPECT_EQ(::poll(fds, n, 0), 0);
}

TEST(ShmPipe, DataWakesTheArmedReaderOnlyWhenArmed) {
  PipePair pp = make_pair(4096);
  ASSERT_TRUE(pp.a && pp.b);
  uint8_t msg[64] = {1, 2, 3}, dst[64] = {};
  ASSERT_TRUE(pp.b->arm(/*want_room=*/false));
  pollfd fds[2];
  int n = pp.b->pollfds(fds);
  std::thread writer([&] {
    std::this_thread::sleep_for(milliseconds(50));
    auto w = write_bytes(*pp.a, msg, sizeof msg);
    EXPECT_TRUE(w.ok() && *w == sizeof msg);
  });
  auto t0 = Clock::now();
  EXPECT_EQ(::poll(fds, n, 60'000), 1);
  EXPECT_TRUE(fds[0].revents & POLLIN);
  EXPECT_LT(Clock::now() - t0, kBound);
  pp.b->disarm();
  writer.join();
  auto r = pp.b->read(dst, sizeof dst);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, sizeof msg);
  EXPECT_EQ(std::memcmp(dst, msg, sizeof msg), 0);
  EXPECT_EQ(pp.a->wakeups_sent(), 1u);
  // Not armed: no ring (no system call); data waiting: arm() refuses.
  ASSERT_TRUE(write_bytes(*pp.a, msg, 10).ok());
  EXPECT_EQ(pp.a->wakeups_sent(), 1u);
  EXPECT_FALSE(pp.b->arm(false));
  EXPECT_EQ(::poll(fds, n, 0), 0);
  r = pp.b->read(dst, 1);  // byte by byte
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 1u);
  EXPECT_EQ(dst[0], msg[0]);
}

TEST(ShmPipe, ShutdownDeliversWhatWasPublishedThenPeerFailed) {
  PipePair pp = make_pair(4096);
  ASSERT_TRUE(pp.a && pp.b);
  std::vector<uint8_t> src(3000), dst(4096);
  testing::fill_pattern(src.data(), src.size(), 11);
  ASSERT_TRUE(write_bytes(*pp.a, src.data(), src.size()).ok());
  pp.a->shutdown();
  pp.a->shutdown();  // idempotent
  auto w = write_bytes(*pp.a, src.data(), 1);
  EXPECT_EQ(w.status().code(), Code::kClosed) << w.status().to_string();
  EXPECT_EQ(pp.a->read(dst.data(), 1).status().code(), Code::kClosed);
  EXPECT_EQ(pp.a->error().code(), Code::kClosed);
  // The peer gets every byte, in pieces, then the close.
  size_t got = 0;
  for (size_t piece : {1000, 1, 4096}) {
    auto r = pp.b->read(dst.data() + got, piece);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    got += *r;
  }
  EXPECT_EQ(got, src.size());
  EXPECT_EQ(testing::check_pattern(dst.data(), got, 11), SIZE_MAX);
  auto r = pp.b->read(dst.data(), 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kPeerFailed);
  EXPECT_NE(r.status().message().find("closed by the peer (pid "), std::string::npos) << r.status().to_string();
  EXPECT_EQ(pp.b->error().code(), Code::kPeerFailed);
  EXPECT_EQ(write_bytes(*pp.b, src.data(), 1).status().code(), Code::kPeerFailed);
  EXPECT_FALSE(pp.b->arm(false));
}

TEST(ShmPipe, ShutdownWakesTheSleepingPeerAndTheOwner) {
  PipePair pp = make_pair(4096);
  ASSERT_TRUE(pp.a && pp.b);
  // The peer, asleep waiting for data.
  std::thread closer([&] {
    std::this_thread::sleep_for(milliseconds(50));
    pp.a->shutdown();
  });
  auto t0 = Clock::now();
  EXPECT_EQ(sleep_on(*pp.b, false, 5000), 1);
  EXPECT_LT(Clock::now() - t0, kBound);
  closer.join();
  uint8_t c;
  EXPECT_EQ(pp.b->read(&c, 1).status().code(), Code::kPeerFailed);
  // Our own owner, asleep, shut down from another thread.
  PipePair qq = make_pair(4096);
  ASSERT_TRUE(qq.a && qq.b);
  std::thread other([&] {
    std::this_thread::sleep_for(milliseconds(50));
    qq.b->shutdown();
  });
  EXPECT_EQ(sleep_on(*qq.b, false, 5000), 1);
  other.join();
  EXPECT_EQ(qq.b->read(&c, 1).status().code(), Code::kClosed);
}

// A forked peer that accepts the pipe and runs `body` (its exit code), its channel end and pid.
struct Child {
  pid_t pid = -1;
  std::unique_ptr<ShmPipe> pipe;
};
Child fork_peer(size_t ring, const std::function<int(ShmPipe&)>& body) {
  auto p = UnixChannel::pair();
  Child c;
  if (!p.ok()) return c;
  c.pid = testing::fork_child([&] {
    { UnixChannel drop = std::move(p->first); }
    auto pipe = ShmPipe::accept(std::move(p->second), secs(10));
    if (!pipe.ok()) return 50;
    return body(**pipe);
  });
  { UnixChannel drop = std::move(p->second); }
  auto pipe = ShmPipe::create(std::move(p->first), {.ring_bytes = ring}, secs(10));
  EXPECT_TRUE(pipe.ok()) << pipe.status().to_string();
  if (pipe.ok()) c.pipe = std::move(*pipe);
  return c;
}

void expect_closed_by(const Status& s, pid_t pid) {
  EXPECT_EQ(s.code(), Code::kPeerFailed) << s.to_string();
  EXPECT_NE(s.message().find("closed by the peer (pid " + std::to_string(pid) + ")"), std::string::npos)
      << s.to_string();
}

TEST(ShmPipe, PeerKilledMidStreamWhileBusyPolling) {
  // The child streams 64 MiB of a pattern through a 64 KiB ring; we read 1 MiB, kill it mid-write,
  // then busy-poll read(): the bytes it published arrive (all correct), then the death.
  constexpr size_t kTotal = 64 << 20;
  static std::vector<uint8_t> src(kTotal);  // made before the fork, used by the child
  testing::fill_pattern(src.data(), src.size(), 21);
  Child c = fork_peer(64 << 10, [](ShmPipe& p) {
    for (size_t off = 0; off < kTotal;) {
      auto w = write_bytes(p, src.data() + off, kTotal - off);
      if (!w.ok()) return 51;
      off += *w;
    }
    for (;;) ::pause();
  });
  ASSERT_TRUE(c.pipe);
  std::vector<uint8_t> dst(kTotal);
  size_t got = 0;
  auto busy_read = [&](size_t until) -> Status {
    while (got < until) {
      auto r = c.pipe->read(dst.data() + got, std::min<size_t>(kTotal - got, 5000));
      if (!r.ok()) return r.status();
      got += *r;
    }
    return Status();
  };
  ASSERT_TRUE(busy_read(1 << 20).ok());
  ::kill(c.pid, SIGKILL);
  auto t0 = Clock::now();
  Status s = busy_read(kTotal);
  EXPECT_LT(Clock::now() - t0, kBound);
  expect_closed_by(s, c.pid);
  EXPECT_GE(got, size_t{1} << 20);
  EXPECT_LT(got, kTotal);
  EXPECT_EQ(testing::check_pattern(dst.data(), got, 21), SIZE_MAX) << "got " << got;
  EXPECT_EQ(write_bytes(*c.pipe, dst.data(), 1).status().code(), Code::kPeerFailed);
  EXPECT_EQ(testing::wait_child(c.pid), 128 + SIGKILL);
}

TEST(ShmPipe, PeerKilledWhileWeSleepWakesUs) {
  // The child publishes 50000 B, then kills itself while we sleep in poll with nothing to read.
  constexpr size_t kSent = 50000;
  Child c = fork_peer(64 << 10, [](ShmPipe& p) {
    std::vector<uint8_t> src(kSent);
    testing::fill_pattern(src.data(), src.size(), 22);
    auto w = write_bytes(p, src.data(), src.size());
    if (!w.ok() || *w != kSent) return 52;
    std::this_thread::sleep_for(milliseconds(200));
    ::raise(SIGKILL);
    return 53;
  });
  ASSERT_TRUE(c.pipe);
  std::vector<uint8_t> dst(kSent + 1);
  size_t got = 0;
  Status s;
  int sleeps = 0;
  auto end = Clock::now() + test::kEventually;
  while (Clock::now() < end) {
    auto r = c.pipe->read(dst.data() + got, dst.size() - got);
    if (!r.ok()) {
      s = r.status();
      break;
    }
    got += *r;
    if (*r == 0 && sleep_on(*c.pipe, false, 5000) >= 0) ++sleeps;
  }
  expect_closed_by(s, c.pid);
  EXPECT_EQ(got, kSent);
  EXPECT_EQ(testing::check_pattern(dst.data(), got, 22), SIZE_MAX);
  EXPECT_GE(sleeps, 1);
  EXPECT_LE(sleeps, 10);  // woken by the death, not by timeouts
  EXPECT_EQ(testing::wait_child(c.pid), 128 + SIGKILL);
}

// ---- a peer that breaks the rules ------------------------------------------------------------
//
// The creator's half written by hand from pipe.cc's layout (page 0: header; page 1: 64-byte
// words; then ring 0 and ring 1), so that the test holds the region the acceptor maps and can do
// what a malicious peer could. Control words: ring 0 head/tail 0/1, ring 1 head/tail 2/3,
// want_data 4/5, want_room 6/7, closed 8/9. Ring d carries side d -> side 1 - d (creator = 0).

constexpr uint64_t kMagic = 0x646d782d70697031ull;  // "dmx-pip1"

struct Forgery {
  uint64_t hello_magic = kMagic, header_magic = kMagic;
  uint64_t ring = 4096;
  int64_t file_delta = 0;  // bytes added to the right region size
  bool seal = true;
  bool eventfd_bell = true;
};

class HandMadeCreator {
 public:
  ~HandMadeCreator() {
    if (base_ != nullptr) ::munmap(base_, total_);
  }
  // Sends a (forged) region and runs the real accept() on the other end in this thread.
  Result<std::unique_ptr<ShmPipe>> offer(const Forgery& f) {
    auto p = UnixChannel::pair();
    if (!p.ok()) return p.status();
    mine_ = std::move(p->first);
    ring_ = f.ring;
    total_ = 8192 + 2 * f.ring;
    size_t file = total_ + f.file_delta;
    mem_.reset(::memfd_create("forged-pipe", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    EXPECT_EQ(::ftruncate(mem_.get(), static_cast<off_t>(file)), 0);
    void* m = ::mmap(nullptr, std::min(file, total_), PROT_READ | PROT_WRITE, MAP_SHARED, mem_.get(), 0);
    EXPECT_NE(m, MAP_FAILED);
    base_ = static_cast<char*>(m);
    total_ = std::min(file, total_);
    uint64_t hdr[5] = {f.header_magic, 1, f.ring, 8192 + 2 * f.ring, uint64_t(::getpid())};
    std::memcpy(base_, hdr, sizeof hdr);
    if (f.seal) {
      EXPECT_EQ(::fcntl(mem_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    }
    int pipefd[2] = {-1, -1};
    if (f.eventfd_bell) {
      bell_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    } else {
      EXPECT_EQ(::pipe(pipefd), 0);
      bell_.reset(pipefd[1]);
      ::close(pipefd[0]);
    }
    uint64_t hello[4] = {f.hello_magic, 1, f.ring, 8192 + 2 * f.ring};
    int fds[2] = {mem_.get(), bell_.get()};
    Status s = mine_.send({reinterpret_cast<const std::byte*>(hello), sizeof hello}, fds, secs(5));
    if (!s.ok()) return s;
    auto pipe = ShmPipe::accept(std::move(p->second), secs(5));
    if (pipe.ok()) {
      std::vector<std::byte> ack;
      std::vector<UniqueFd> got;
      EXPECT_TRUE(mine_.recv(&ack, 1, &got, secs(5)).ok());
    }
    return pipe;
  }
  std::atomic<uint64_t>& word(int i) { return *reinterpret_cast<std::atomic<uint64_t>*>(base_ + 4096 + 64 * i); }
  char* ring(int d) { return base_ + 8192 + d * ring_; }

 private:
  UnixChannel mine_;  // kept open: its hang-up would read as our death
  UniqueFd mem_, bell_;
  char* base_ = nullptr;
  size_t total_ = 0, ring_ = 0;
};

TEST(ShmPipe, HandMadeCreatorIsAcceptedAndSpeaksTheLayout) {
  // Checks the test's idea of the layout, which the corruption tests rely on.
  HandMadeCreator fake;
  auto pipe = fake.offer({});
  ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
  // 4090 bytes, then 10 that wrap around the end of the ring.
  fake.word(0).store(4090);
  std::vector<char> skip(4090);
  auto r = (*pipe)->read(skip.data(), skip.size());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, 4090u);
  EXPECT_EQ(fake.word(1).load(), 4090u);  // the acceptor's tail of ring 0
  std::memcpy(fake.ring(0) + 4090, "abcdef", 6);
  std::memcpy(fake.ring(0), "ghij", 4);
  fake.word(0).store(4100);
  char dst[16] = {};
  r = (*pipe)->read(dst, sizeof dst);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, 10u);
  EXPECT_STREQ(dst, "abcdefghij");
  EXPECT_EQ(fake.word(1).load(), 4100u);
  ASSERT_TRUE(write_bytes(**pipe, "xyz", 3).ok());
  EXPECT_EQ(fake.word(2).load(), 3u);
  EXPECT_EQ(std::memcmp(fake.ring(1), "xyz", 3), 0);
}

TEST(ShmPipe, CorruptHeadIsAProtocolError) {
  for (int variant : {0, 1, 2}) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    HandMadeCreator fake;
    auto pipe = fake.offer({});
    ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
    char dst[8192];
    fake.word(0).store(100);
    auto r = (*pipe)->read(dst, 10);
    ASSERT_TRUE(r.ok());
    if (variant == 0) fake.word(0).store(10 + 4096 + 1);  // more than a ring's worth unread
    if (variant == 1) fake.word(0).store(50);             // backwards
    if (variant == 2) fake.word(0).store(~0ull);          // wraps the arithmetic
    r = (*pipe)->read(dst, sizeof dst);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kProtocol) << r.status().to_string();
    EXPECT_NE(r.status().message().find("corrupt"), std::string::npos) << r.status().to_string();
    EXPECT_NE(r.status().to_string().find("pid "), std::string::npos) << r.status().to_string();
    EXPECT_EQ((*pipe)->error().code(), Code::kProtocol);
    // Broken for good: nothing else moves, nothing is read out of bounds.
    fake.word(0).store(100);
    EXPECT_EQ((*pipe)->read(dst, 1).status().code(), Code::kProtocol);
    EXPECT_EQ(write_bytes(**pipe, dst, 1).status().code(), Code::kProtocol);
    EXPECT_FALSE((*pipe)->arm(true));
  }
}

TEST(ShmPipe, CorruptTailIsAProtocolError) {
  for (uint64_t bad : {uint64_t{1} << 40, uint64_t{5}}) {
    HandMadeCreator fake;
    auto pipe = fake.offer({});
    ASSERT_TRUE(pipe.ok()) << pipe.status().to_string();
    char src[100] = {};
    ASSERT_TRUE(write_bytes(**pipe, src, 100).ok());
    fake.word(3).store(50);  // the consumer (fake) released 50 of them: fine
    ASSERT_TRUE(write_bytes(**pipe, src, 10).ok());
    fake.word(3).store(bad);  // past our head, or backwards
    auto w = write_bytes(**pipe, src, 10);
    ASSERT_FALSE(w.ok()) << bad;
    EXPECT_EQ(w.status().code(), Code::kProtocol) << w.status().to_string();
    EXPECT_NE(w.status().message().find("tail"), std::string::npos) << w.status().to_string();
  }
}

TEST(ShmPipe, SetupRefusesForgedRegions) {
  struct Case {
    const char* what;
    Forgery f;
    const char* expect;
  };
  Forgery wrong_magic, wrong_header, too_big, unsealed, odd_ring, pipe_bell;
  wrong_magic.hello_magic = 0x1234;
  wrong_header.header_magic = 0x1234;
  too_big.file_delta = 4096;
  unsealed.seal = false;
  odd_ring.ring = 5000;
  pipe_bell.eventfd_bell = false;
  for (const Case& c :
       {Case{"hello magic", wrong_magic, "another protocol"}, Case{"header magic", wrong_header, "header disagrees"},
        Case{"file size", too_big, "region fd of"}, Case{"unsealed", unsealed, "not sealed"},
        Case{"ring size", odd_ring, "a ring of 5000 B"}, Case{"doorbell", pipe_bell, "not an eventfd"}}) {
    HandMadeCreator fake;
    auto pipe = fake.offer(c.f);
    ASSERT_FALSE(pipe.ok()) << c.what;
    EXPECT_EQ(pipe.status().code(), Code::kProtocol) << c.what << ": " << pipe.status().to_string();
    EXPECT_NE(pipe.status().message().find(c.expect), std::string::npos) << c.what << ": " << pipe.status().to_string();
    EXPECT_NE(pipe.status().to_string().find("pid "), std::string::npos) << pipe.status().to_string();
  }
}

TEST(ShmPipe, CreateRefusesBadRingSizes) {
  for (size_t ring : {size_t{0}, size_t{2048}, size_t{5000}, size_t{128} << 20}) {
    auto p = UnixChannel::pair();
    ASSERT_TRUE(p.ok());
    auto pipe = ShmPipe::create(std::move(p->first), {.ring_bytes = ring}, secs(1));
    ASSERT_FALSE(pipe.ok()) << ring;
    EXPECT_EQ(pipe.status().code(), Code::kInvalidArgument) << pipe.status().to_string();
  }
}

TEST(ShmPipe, PingPongLatencyOfSmallMessages) {
  // Printed, not asserted: two threads spinning, 64-byte messages, half a round trip.
  PipePair pp = make_pair(1 << 20);
  ASSERT_TRUE(pp.a && pp.b);
  constexpr int kRounds = 20000, kWarmup = 2000;
  auto exchange = [](ShmPipe& p, uint8_t* buf) -> bool {
    size_t got = 0;
    while (got < 64) {
      auto r = p.read(buf + got, 64 - got);
      if (!r.ok()) return false;
      got += *r;
    }
    auto w = write_bytes(p, buf, 64);
    return w.ok() && *w == 64;
  };
  auto echo = std::async(std::launch::async, [&] {
    uint8_t buf[64];
    for (int i = 0; i < kRounds + kWarmup; ++i)
      if (!exchange(*pp.b, buf)) return false;
    return true;
  });
  std::vector<double> half_rtt_us;
  uint8_t buf[64] = {};
  bool ok = true;
  for (int i = 0; ok && i < kRounds + kWarmup; ++i) {
    auto t0 = Clock::now();
    ok = write_bytes(*pp.a, buf, 64).ok();
    for (size_t got = 0; ok && got < 64;) {
      auto r = pp.a->read(buf + got, 64 - got);
      ok = r.ok();
      if (ok) got += *r;
    }
    if (i >= kWarmup) half_rtt_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 2);
  }
  if (!ok) pp.a->shutdown();  // the echo thread ends
  EXPECT_TRUE(ok);
  EXPECT_TRUE(echo.get());
  ASSERT_FALSE(half_rtt_us.empty());
  std::sort(half_rtt_us.begin(), half_rtt_us.end());
  std::printf("shm pipe ping-pong, 64 B, half round trip: p50 %.3f us, p90 %.3f us, p99 %.3f us (%u cores)\n",
              half_rtt_us[half_rtt_us.size() / 2], half_rtt_us[half_rtt_us.size() * 9 / 10],
              half_rtt_us[half_rtt_us.size() * 99 / 100], std::thread::hardware_concurrency());
}

}  // namespace
}  // namespace dmx::shm
