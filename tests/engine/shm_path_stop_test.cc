// The shm payload path's end: stop with chunks pending, stop before start, the keep-alive
// released after stop, and the peer killed mid-transfer in a child process. Helpers in
// shm_path_util.h; every wait has a deadline.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "engine/shm_path_util.h"

namespace dmx {
namespace {

using namespace shm_test;

// stop() with chunks pending in both directions: prompt, every chunk completes (kClosed), then
// on_path_stopped once; idempotent; later posts are refused. The peer sees the hang-up.
TEST(ShmPath, StopWithChunksPendingCompletesThemPromptly) {
  auto p = make_paths(config("4", "64K"));
  ASSERT_TRUE(p->ok());
  std::vector<unsigned char> src(kShmMaxChunk), dst(kShmMaxChunk);
  fill_random(src.data(), src.size());
  std::vector<unsigned char> desc;
  for (uint64_t s = 0; s < 4; ++s) {  // b never receives: a's ring fills, chunk 0 is mid-way
    auto d = p->a->post_tx(s, {src.data(), src.size(), {}}, true);
    ASSERT_TRUE(d.ok());
    desc = *d;
  }
  for (uint64_t s = 0; s < 4; ++s)  // b never sends these
    ASSERT_TRUE(p->a->post_rx(s, desc, {dst.data(), dst.size(), {}}).ok());
  std::this_thread::sleep_for(20ms);
  auto t0 = Clock::now();
  p->a->stop();
  EXPECT_LT(Clock::now() - t0, kPrompt);
  p->a->stop();  // idempotent
  ASSERT_TRUE(p->ra.wait_stopped(kPrompt));
  for (uint64_t s = 0; s < 4; ++s) {
    for (bool tx : {true, false}) {
      Status st = p->ra.wait(tx, s, 1ms);
      EXPECT_EQ(st.code(), Code::kClosed) << st.to_string();
    }
  }
  EXPECT_TRUE(p->ra.failed().empty());  // a stop is not a failure
  EXPECT_EQ(p->ra.stopped(), 1);
  EXPECT_EQ(p->a->post_tx(9, {src.data(), 1, {}}, true).status().code(), Code::kClosed);
  EXPECT_EQ(p->a->post_rx(9, desc, {nullptr, 0, {}}).code(), Code::kClosed);
  ASSERT_TRUE(p->rb.wait_failed(kPrompt));
  EXPECT_EQ(p->rb.failed()[0].code(), Code::kPeerFailed);
  EXPECT_NE(p->rb.failed()[0].to_string().find("pid " + std::to_string(::getpid())), std::string::npos);
  EXPECT_TRUE(p->rb.wait_stopped(kPrompt));
  EXPECT_EQ(p->ra.stopped(), 1);
}

// stop() before start(): start() still ends with exactly one on_path_stopped; posts were refused.
TEST(ShmPath, StopBeforeStart) {
  auto ch = UnixChannel::pair();
  ASSERT_TRUE(ch.ok());
  shm::LinkOptions c = config();
  auto fut = std::async(std::launch::async, [&] { return make_shm_path(std::move(ch->second), false, c, secs(10)); });
  auto a = make_shm_path(std::move(ch->first), true, c, secs(10));
  auto b = fut.get();
  ASSERT_TRUE(a.ok() && b.ok());
  (*a)->stop();
  char x = 1;
  EXPECT_EQ((*a)->post_tx(0, {&x, 1, {}}, true).status().code(), Code::kClosed);
  Recorder r;
  (*a)->start(&r, nullptr);
  EXPECT_TRUE(r.wait_stopped(kPrompt));
  a->reset();
  EXPECT_EQ(r.stopped(), 1);
  EXPECT_EQ(r.completions(), 0u);
  b->reset();  // never started: no events, nothing to wait for
}

// A path destroyed on its own thread (the last keep_alive dropped after on_path_stopped) must not
// deadlock or crash. (Whoever calls stop() must hold a reference: the path may go as it returns.)
TEST(ShmPath, KeepAliveReleasedAfterStopped) {
  struct Holder {
    std::unique_ptr<PayloadPath> path;
  };
  auto holder = std::make_shared<Holder>();
  auto ch = UnixChannel::pair();
  ASSERT_TRUE(ch.ok());
  shm::LinkOptions c = config();
  auto fut = std::async(std::launch::async, [&] { return make_shm_path(std::move(ch->second), false, c, secs(10)); });
  auto a = make_shm_path(std::move(ch->first), true, c, secs(10));
  auto b = fut.get();
  ASSERT_TRUE(a.ok() && b.ok());
  holder->path = std::move(*a);
  Recorder r, rb;
  std::weak_ptr<Holder> weak = holder;
  holder->path->start(&r, holder);
  (*b)->start(&rb, nullptr);
  holder.reset();  // only the path's thread keeps it now; this thread no longer touches it
  b->reset();       // the peer goes: the path fails, stops, and drops the last reference itself
  EXPECT_TRUE(r.wait_stopped(kPrompt));
  auto t0 = Clock::now();
  while (!weak.expired() && Clock::now() - t0 < kPrompt) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(weak.expired());
  ASSERT_EQ(r.failed().size(), 1u);
  EXPECT_EQ(r.failed()[0].code(), Code::kPeerFailed);
}

// ---- the peer killed mid-transfer (a child process) ----------------------------------------------

class Quiet : public PayloadPath::Events {
  void on_path_tx_done(uint64_t, const Status&) override {}
  void on_path_rx_done(uint64_t, const Status&) override {}
  void on_path_failed(const Status&) override {}
  void on_path_stopped() override {}
};

TEST(ShmPath, PeerKilledMidTransferFailsEveryPendingChunk) {
  constexpr size_t kSmall = 1000, kBig = kShmMaxChunk;
  static std::vector<unsigned char> child_src(kBig);  // before fork: the child sends from it
  fill_random(child_src.data(), child_src.size());
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  auto ch = UnixChannel::pair();
  ASSERT_TRUE(ch.ok());
  shm::LinkOptions c = config("4", "64K");
  pid_t child = ::fork();
  if (child == 0) {
    { UnixChannel drop = std::move(ch->first); }
    auto path = make_shm_path(std::move(ch->second), false, c, secs(10));
    if (!path.ok()) ::_exit(50);
    Quiet q;
    (*path)->start(&q, nullptr);
    // seq 0: small, arrives whole; seq 1: 4 MiB through a 256 KiB ring, cut short by the kill.
    if (!(*path)->post_tx(0, {child_src.data(), kSmall, {}}, true).ok()) ::_exit(51);
    if (!(*path)->post_tx(1, {child_src.data(), kBig, {}}, true).ok()) ::_exit(52);
    char r = 'r';
    (void)!::write(ready[1], &r, 1);
    for (;;) ::pause();
  }
  ASSERT_GT(child, 0);
  struct Reaper {  // kills the child if an assertion ends the test early
    pid_t pid;
    ~Reaper() {
      if (pid > 0 && ::kill(pid, SIGKILL) == 0) ::waitpid(pid, nullptr, 0);
    }
  } reaper{child};
  ::close(ready[1]);  // a child that dies early reads as EOF below, not a hang
  { UnixChannel drop = std::move(ch->second); }
  auto made = make_shm_path(std::move(ch->first), true, c, secs(10));
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  std::unique_ptr<PayloadPath> path = std::move(*made);
  Recorder r;
  // Stall the path's thread in the completion of seq 0 until the child is dead: by then it has
  // copied part of seq 1 (at most a ring's worth: the child cannot publish more).
  std::promise<void> in_hook, release;
  auto released = release.get_future().share();
  r.set_rx_hook([&, once = std::make_shared<std::once_flag>()](uint64_t seq) {
    if (seq != 0) return;
    std::call_once(*once, [&] {
      in_hook.set_value();
      released.wait_for(kWait);
    });
  });
  path->start(&r, nullptr);
  std::vector<unsigned char> small(kSmall), big(kBig), out(kBig);
  fill_random(out.data(), out.size());
  char x;
  ASSERT_EQ(::read(ready[0], &x, 1), 1) << "the child did not get ready";
  auto d0 = encode_for_test(kSmall), d1 = encode_for_test(kBig);
  ASSERT_TRUE(path->post_rx(0, d0, {small.data(), kSmall, {}}).ok());
  ASSERT_TRUE(path->post_rx(1, d1, {big.data(), kBig, {}}).ok());
  ASSERT_TRUE(path->post_rx(2, d0, {small.data(), kSmall, {}}).ok());  // never sent
  // The child receives nothing: these stay pending (the first one mid-way, the ring full).
  for (uint64_t s = 0; s < 3; ++s) ASSERT_TRUE(path->post_tx(s, {out.data(), out.size(), {}}, true).ok());
  ASSERT_EQ(in_hook.get_future().wait_for(kWait), std::future_status::ready);
  ::kill(child, SIGKILL);
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  reaper.pid = -1;
  auto t0 = Clock::now();
  release.set_value();

  ASSERT_TRUE(r.wait_stopped(kWait));
  EXPECT_LT(Clock::now() - t0, kPrompt);
  Status s0 = r.wait(false, 0, 1ms);
  EXPECT_TRUE(s0.ok()) << s0.to_string();
  EXPECT_EQ(std::memcmp(small.data(), child_src.data(), kSmall), 0);
  std::vector<Status> failed = r.failed();
  ASSERT_EQ(failed.size(), 1u);
  const std::string pid = "pid " + std::to_string(child);
  EXPECT_EQ(failed[0].code(), Code::kPeerFailed) << failed[0].to_string();
  EXPECT_NE(failed[0].to_string().find(pid), std::string::npos) << failed[0].to_string();
  EXPECT_EQ(r.failed_at(), 1u) << "only rx seq 0 completed before on_path_failed";
  for (auto [tx, seq] : {std::pair{false, 1}, {false, 2}, {true, 0}, {true, 1}, {true, 2}}) {
    Status s = r.wait(tx, seq, 1ms);
    EXPECT_EQ(s.code(), Code::kPeerFailed) << (tx ? "tx " : "rx ") << seq << ": " << s.to_string();
    EXPECT_NE(s.to_string().find(pid), std::string::npos) << s.to_string();
  }
  EXPECT_EQ(r.completions(), 6u);
  EXPECT_EQ(path->post_tx(7, {out.data(), 1, {}}, true).status().code(), Code::kPeerFailed);
  path.reset();
  EXPECT_EQ(r.stopped(), 1);
  ::close(ready[0]);
}

}  // namespace
}  // namespace dmx
