// The shm payload path with simulated device memory on either end: chunks staged through the
// slots by device copies, the bounce pool exhausted, odd sizes many in flight, a link closed while
// a kernel runs, stop beside a busy device. Helpers in shm_path_util.h; every wait has a deadline.
#include <gtest/gtest.h>

#include <cstring>
#include <future>

#include "engine/shm_path_util.h"
#include "memory/bounce_pool.h"
#include "memory/sim_device.h"

namespace dmx {
namespace {

using namespace shm_test;

// Simulated device memory (only its copy queue may touch it) on either or both ends.
TEST(ShmPath, SimDeviceMemoryStagedThroughSlots) {
  auto p = make_paths(config("4", "64K"));
  ASSERT_TRUE(p->ok());
  const MemSpec sim{MemKind::kSim, 0}, host{};
  uint64_t seq = 0;
  for (auto [from, to] : {std::pair{sim, sim}, {host, sim}, {sim, host}}) {
    for (size_t n : {size_t(1), size_t(4097), size_t(kShmMaxChunk) - 5}) {
      auto src = Buffer::allocate(from, n + 3);
      auto dst = Buffer::allocate(to, n + 5);
      ASSERT_TRUE(src.ok() && dst.ok());
      std::vector<unsigned char> data(n), back(n);
      fill_random(data.data(), n);
      ASSERT_TRUE(copy_memory(src->region().sub(3, n), {data.data(), n, {}}).ok());
      auto d = p->a->post_tx(seq, src->region().sub(3, n), true);
      ASSERT_TRUE(d.ok()) << d.status().to_string();
      ASSERT_TRUE(p->b->post_rx(seq, *d, dst->region().sub(5, n)).ok());
      Status s = p->ra.wait(true, seq);
      ASSERT_TRUE(s.ok()) << s.to_string();
      s = p->rb.wait(false, seq);
      ASSERT_TRUE(s.ok()) << s.to_string();
      ASSERT_TRUE(copy_memory({back.data(), n, {}}, dst->region().sub(5, n)).ok());
      EXPECT_EQ(std::memcmp(back.data(), data.data(), n), 0) << to_string(from) << " -> " << to_string(to) << " " << n;
      ++seq;
    }
  }
  EXPECT_GT(p->a->stats().device_copies, 0u);
  EXPECT_GT(p->b->stats().device_copies, 0u);
}

// A link that staged into device memory holds nothing pinned (its device copies go through the
// process's bounce buffers). Unpinning would wait for an idle device (cudaHostUnregister), which a
// persistent kernel of this process (the Lynx GPU workers) never lets it be, and it runs on the
// stream worker that close() waits for: stopping and destroying the paths waits for no device.
TEST(ShmPath, StopDoesNotWaitForABusyDeviceToUnpinTheSlots) {
  auto p = make_paths(config("4", "64K"));
  ASSERT_TRUE(p->ok());
  const MemSpec sim{MemKind::kSim, 0};
  const size_t n = 4097;
  auto dst = Buffer::allocate(sim, n);
  ASSERT_TRUE(dst.ok());
  std::vector<unsigned char> src(n), back(n);
  fill_random(src.data(), n);
  auto d = p->a->post_tx(0, {src.data(), n, {}}, true);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  ASSERT_TRUE(p->b->post_rx(0, *d, dst->region()).ok());
  ASSERT_TRUE(p->ra.wait(true, 0).ok());
  ASSERT_TRUE(p->rb.wait(false, 0).ok());
  ASSERT_TRUE(copy_memory({back.data(), n, {}}, dst->region()).ok());
  ASSERT_EQ(std::memcmp(back.data(), src.data(), n), 0);
  ASSERT_GT(p->b->stats().device_copies, 0u);

  const uint64_t waits_before = sim_idle_waits();
  sim_hold_device_busy(true);
  // Old code waited here for the device; let it go after a while so that a failure ends.
  std::promise<void> measured;
  auto release = std::async(std::launch::async, [f = measured.get_future()] {
    (void)f.wait_for(20s);
    sim_hold_device_busy(false);
  });
  auto t0 = Clock::now();
  p->b->stop();
  p->b.reset();
  p->a->stop();
  p->a.reset();
  auto took = Clock::now() - t0;
  EXPECT_LT(took, 10s) << "stopping the paths waited "
                       << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                       << " ms for the busy device";
  EXPECT_EQ(sim_idle_waits(), waits_before) << "something waited for the busy device";
  measured.set_value();
  release.get();
}

// The bounce pool exhausted (limited to one piece): the links wait for their own device copies to
// give buffers back, never for more memory, and every byte still arrives, both ways at once.
TEST(ShmPath, SimDeviceChunksCompleteWithTheBouncePoolExhausted) {
  auto p = make_paths(config("8", "64K"));
  ASSERT_TRUE(p->ok());
  struct Restore {
    ~Restore() { set_bounce_limit_for_test(0); }
  } restore;
  set_bounce_limit_for_test(1);  // one 2 MiB piece in use at once, process-wide
  const MemSpec sim{MemKind::kSim, 0}, host{};
  std::mt19937 rng(std::random_device{}());
  uint64_t ab = 0, ba = 0;
  for (auto [from, to] : {std::pair{sim, sim}, {sim, host}, {host, sim}}) {
    std::vector<size_t> sizes{size_t(kShmMaxChunk), 5, (64 << 10) + 9};
    for (int i = 0; i < 13; ++i) sizes.push_back(1 + rng() % (2 << 20));
    Batch there, back;
    ASSERT_NO_FATAL_FAILURE(post_batch(*p->a, *p->b, &ab, from, to, sizes, &there));
    ASSERT_NO_FATAL_FAILURE(post_batch(*p->b, *p->a, &ba, from, to, sizes, &back));
    ASSERT_NO_FATAL_FAILURE(wait_batch(p->ra, p->rb, there));
    ASSERT_NO_FATAL_FAILURE(wait_batch(p->rb, p->ra, back));
    std::string what = to_string(from) + " -> " + to_string(to);
    ASSERT_NO_FATAL_FAILURE(check_batch(there, what + " a->b"));
    ASSERT_NO_FATAL_FAILURE(check_batch(back, what + " b->a"));
  }
  auto pool = BouncePool::of(sim);
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->in_use(), 0u) << "bounce buffers not given back";
  EXPECT_TRUE(p->ra.failed().empty());
  EXPECT_TRUE(p->rb.failed().empty());
}

// Device memory moved through the slots (staged through pinned bounce buffers): odd sizes and
// offsets, both directions at once, many chunks in flight, sim on one end or both.
TEST(ShmPath, SimDeviceChunksOddSizesManyInFlightBothWays) {
  auto p = make_paths(config("4", "64K"));
  ASSERT_TRUE(p->ok());
  const MemSpec sim{MemKind::kSim, 0}, host{};
  std::mt19937 rng(std::random_device{}());
  uint64_t ab = 0, ba = 0;
  for (auto [from, to] : {std::pair{sim, sim}, {host, sim}, {sim, host}}) {
    std::vector<size_t> sizes{1, 63, 4097, (64 << 10) - 1, (64 << 10) + 1, size_t(kShmMaxChunk) - 5};
    for (int i = 0; i < 18; ++i) sizes.push_back(1 + rng() % (1 << 20));
    Batch there, back;
    ASSERT_NO_FATAL_FAILURE(post_batch(*p->a, *p->b, &ab, from, to, sizes, &there));
    ASSERT_NO_FATAL_FAILURE(post_batch(*p->b, *p->a, &ba, from, to, sizes, &back));
    ASSERT_NO_FATAL_FAILURE(wait_batch(p->ra, p->rb, there));
    ASSERT_NO_FATAL_FAILURE(wait_batch(p->rb, p->ra, back));
    std::string what = to_string(from) + " -> " + to_string(to);
    ASSERT_NO_FATAL_FAILURE(check_batch(there, what + " a->b"));
    ASSERT_NO_FATAL_FAILURE(check_batch(back, what + " b->a"));
  }
  EXPECT_GT(p->a->stats().device_copies, 0u);
  EXPECT_GT(p->b->stats().device_copies, 0u);
  EXPECT_TRUE(p->ra.failed().empty());
  EXPECT_TRUE(p->rb.failed().empty());
}

// A persistent kernel of this process (the Lynx GPU workers) keeps the device busy: a call that
// waits for an idle device (cudaHostUnregister, cudaFreeHost) then waits until the kernel stops,
// holding the driver's process-wide lock, and every other CUDA call of the process waits behind it
// (issue 42). With such a kernel running, a link that did device copies closes; then a second
// link's device copies, both ways, and its close complete promptly, and no call waited for the
// device.
TEST(ShmPath, DeviceCopiesGoOnAfterALinkClosesWhileAKernelRuns) {
  const MemSpec sim{MemKind::kSim, 0}, host{};
  const std::vector<size_t> sizes{4097, (1 << 20) + 3, 77};
  const uint64_t waits_before = sim_idle_waits();
  Batch b1, b2, b3, b4;  // their buffers are freed last, after the "kernel" stopped (cudaFree waits too)
  sim_hold_device_busy(true);
  // Old code waited for the device; let it go after a while so that a failure ends.
  std::promise<void> measured;
  auto release = std::async(std::launch::async, [f = measured.get_future()] {
    (void)f.wait_for(20s);
    sim_hold_device_busy(false);
  });
  auto t0 = Clock::now();
  {
    auto p = make_paths(config("4", "64K"));
    ASSERT_TRUE(p->ok());
    uint64_t ab = 0, ba = 0;
    ASSERT_NO_FATAL_FAILURE(post_batch(*p->a, *p->b, &ab, host, sim, sizes, &b1));
    ASSERT_NO_FATAL_FAILURE(post_batch(*p->b, *p->a, &ba, sim, host, sizes, &b2));
    ASSERT_NO_FATAL_FAILURE(wait_batch(p->ra, p->rb, b1));
    ASSERT_NO_FATAL_FAILURE(wait_batch(p->rb, p->ra, b2));
    p->b->stop();
    p->a->stop();
  }  // both links destroyed
  // Whatever the close left to run on threads of its own gets the time to start.
  for (auto t1 = Clock::now(); sim_idle_waits() == waits_before && Clock::now() - t1 < 1s;)
    std::this_thread::sleep_for(1ms);
  {
    auto p = make_paths(config("4", "64K"));
    ASSERT_TRUE(p->ok());
    uint64_t ab = 0, ba = 0;
    ASSERT_NO_FATAL_FAILURE(post_batch(*p->a, *p->b, &ab, sim, host, sizes, &b3));
    ASSERT_NO_FATAL_FAILURE(post_batch(*p->b, *p->a, &ba, host, sim, sizes, &b4));
    ASSERT_NO_FATAL_FAILURE(wait_batch(p->ra, p->rb, b3));
    ASSERT_NO_FATAL_FAILURE(wait_batch(p->rb, p->ra, b4));
    p->a->stop();
    p->b->stop();
  }
  auto took = Clock::now() - t0;
  EXPECT_LT(took, 10s) << "the second link's device copies and close waited "
                       << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                       << " ms, behind a call waiting for the busy device";
  EXPECT_EQ(sim_idle_waits(), waits_before) << "a call waited for the device while the kernel ran";
  measured.set_value();
  release.get();
  ASSERT_NO_FATAL_FAILURE(check_batch(b1, "first link a->b"));
  ASSERT_NO_FATAL_FAILURE(check_batch(b2, "first link b->a"));
  ASSERT_NO_FATAL_FAILURE(check_batch(b3, "second link a->b"));
  ASSERT_NO_FATAL_FAILURE(check_batch(b4, "second link b->a"));
}

}  // namespace
}  // namespace dmx
