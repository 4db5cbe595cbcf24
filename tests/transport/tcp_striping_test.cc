// The tcp transport's striping on its own (transport/tcp/striping.cc): chunk sizes, which stream
// pulls, whom it wakes. tests/engine/balance_test.cc checks the spread through the engine.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>
#include <thread>
#include <chrono>

#include "transport/tcp/striping.h"

namespace dmx {
namespace {

constexpr uint64_t kChunk = 1 << 20, kHostChunk = 256 << 10;

struct Rig {
  explicit Rig(size_t streams, bool acked = false)
      : striping(tcp::make_striping(StripingSetup{streams, kChunk, kHostChunk, [this](int i) {
          woken.push_back(i);
        }, acked})) {}
  std::vector<int> woken;
  std::unique_ptr<Striping> striping;
};

MemSpec host() { return MemSpec{}; }
MemSpec device() {
  MemSpec m;
  m.kind = MemKind::kCuda;
  return m;
}

TEST(TcpStriping, SmallHostMessagesGoInHostChunks) {
  Rig r(9);  // 8 data streams and the control stream
  EXPECT_EQ(r.striping->chunk(kChunk, host()), kHostChunk) << "1 MiB on 8 streams spreads";
  EXPECT_EQ(r.striping->chunk(8 * kChunk - 1, host()), kHostChunk);
  EXPECT_EQ(r.striping->chunk(8 * kChunk, host()), kChunk) << "a chunk_size chunk for every data stream";
  EXPECT_EQ(r.striping->chunk(kChunk, device()), kChunk) << "device memory keeps its staging unit";
}

TEST(TcpStriping, TheControlStreamPullsNone) {
  Rig r(3);
  EXPECT_FALSE(r.striping->pulls(0));
  EXPECT_TRUE(r.striping->pulls(1));
  EXPECT_TRUE(r.striping->pulls(2));
}

// A stream may hold one chunk more than the least loaded; the next it leaves to that one, which
// it wakes. Writing a chunk gives the turn back.
TEST(TcpStriping, AStreamAheadLeavesTheChunkToTheLeastLoaded) {
  Rig r(4);  // data streams 1, 2, 3
  r.striping->took(2);
  r.striping->took(1);
  EXPECT_TRUE(r.striping->pulls(1)) << "1 taken and not written against stream 3's 0: within the slack";
  r.striping->took(1);
  EXPECT_FALSE(r.striping->pulls(1)) << "2 against 0";
  EXPECT_EQ(r.woken, std::vector<int>{3});
  EXPECT_TRUE(r.striping->pulls(2));
  r.striping->wrote(1);
  EXPECT_TRUE(r.striping->pulls(1));
  r.striping->wrote(3);  // never took one: no underflow
  EXPECT_TRUE(r.striping->pulls(3));
  EXPECT_TRUE(r.striping->pulls(1)) << "stream 3 is still the least loaded";
}

// A new transfer wakes as many streams as it has chunks, least loaded first; at least one.
TEST(TcpStriping, ANewTransferWakesOneStreamPerChunkLeastLoadedFirst) {
  Rig r(9);
  for (int s : {1, 2, 3, 4}) r.striping->took(s);
  r.striping->wake_for(kChunk, kChunk, host());  // four 256 KiB chunks
  std::vector<int> woken = r.woken;
  std::sort(woken.begin(), woken.end());
  EXPECT_EQ(woken, (std::vector<int>{5, 6, 7, 8}));
  r.woken.clear();
  r.striping->wake_for(kChunk, 0, host());  // an empty transfer still needs a stream
  EXPECT_EQ(r.woken.size(), 1u);
  r.woken.clear();
  r.striping->wake_for(64 * kChunk, 64 * kChunk, host());
  EXPECT_EQ(r.woken.size(), 8u) << "never the control stream";
}

}  // namespace
}  // namespace dmx

namespace dmx {
namespace {

// Several links (acknowledged completions): a stream whose chunks complete slowly gets fewer. Two
// data streams, stream 2 four times slower than stream 1; the one expected to finish its next
// chunk first takes it.
TEST(TcpStriping, ByCompletionASlowLinkGetsLess) {
  Rig r(3, /*acked=*/true);
  auto ms = [](int n) { std::this_thread::sleep_for(std::chrono::milliseconds(n)); };
  // Measure: each takes a chunk; 1 completes after 10 ms, 2 after 40 ms.
  r.striping->took(1);
  r.striping->took(2);
  ms(10);
  r.striping->wrote(1);
  ms(30);
  r.striping->wrote(2);
  // Both idle: stream 1 (10 ms per chunk) is first; stream 2 leaves it the chunk and wakes it.
  EXPECT_TRUE(r.striping->pulls(1));
  EXPECT_FALSE(r.striping->pulls(2));
  EXPECT_EQ(r.woken, std::vector<int>{1});
  // Stream 1 with 10 in flight would finish an 11th at about 110 ms, stream 2 its first at about
  // 40: beyond the half chunk (20 ms) that ties are given, so stream 2 takes it.
  for (int i = 0; i < 10; ++i) r.striping->took(1);
  EXPECT_TRUE(r.striping->pulls(2));
  EXPECT_FALSE(r.striping->pulls(1));
  // A stream gone is passed over whatever its numbers.
  r.striping->down(2);
  EXPECT_TRUE(r.striping->pulls(1));
}

}  // namespace
}  // namespace dmx
