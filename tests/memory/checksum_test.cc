// CRC32C of device memory computed on the device (CopyQueue::checksum): the sim backend's worker
// on this machine, the CUDA kernel on the GPU machine. Checked against the CPU's CRC of the same
// fresh random bytes at odd sizes and offsets.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/crc32c.h"
#include "memory/backend.h"
#include "test_env.h"

namespace dmx {
namespace {

constexpr MemSpec kHost{MemKind::kHost, 0};

class DeviceChecksum : public ::testing::TestWithParam<MemKind> {
 protected:
  void SetUp() override {
    if (GetParam() == MemKind::kCuda) {
      auto n = cuda_device_count();
      if (!n.ok()) DMX_SKIP(::dmx::test::kNoGpu) << n.status().message();
    }
    spec_ = MemSpec{GetParam(), 0};
    auto b = backend_for(spec_);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    backend_ = *b;
    auto q = backend_->create_queue();
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    queue_ = std::move(*q);
  }
  // Fresh random bytes of `n` at offset `off` in a new device buffer, and their CPU CRC.
  uint32_t fill(Buffer* out, size_t n, size_t off) {
    std::vector<unsigned char> v(n);
    std::mt19937_64 rng(std::random_device{}());
    for (auto& b : v) b = static_cast<unsigned char>(rng());
    auto dev = Buffer::allocate(spec_, n + off + 1);
    EXPECT_TRUE(dev.ok()) << dev.status().to_string();
    EXPECT_TRUE(copy_memory(dev->region().sub(off, n), MemRegion{v.data(), n, kHost}).ok());
    *out = std::move(*dev);
    return crc32c::of(v.data(), n);
  }
  MemSpec spec_;
  MemoryBackend* backend_ = nullptr;
  std::unique_ptr<CopyQueue> queue_;
};

TEST_P(DeviceChecksum, EqualsTheCpuCrcAtOddSizesAndOffsets) {
  const size_t big = GetParam() == MemKind::kCuda ? (size_t{256} << 20) + 5 : (size_t{8} << 20) + 5;
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{4095}, (size_t{1} << 20) + 3, big})
    for (size_t off : {size_t{0}, size_t{1}, size_t{7}, size_t{13}}) {
      SCOPED_TRACE(testing::Message() << n << " B at offset " << off);
      Buffer dev;
      uint32_t want = fill(&dev, n, off);
      const char* p = static_cast<const char*>(dev.data()) + off;
      auto ticket = queue_->checksum(p, n);
      ASSERT_TRUE(ticket.ok()) << ticket.status().to_string();
      auto fence = queue_->record();
      ASSERT_TRUE(fence.ok());
      ASSERT_TRUE(queue_->wait(*fence, Deadline::after(std::chrono::seconds(30))).ok());
      EXPECT_EQ(queue_->checksum_result(*ticket), want);
      auto direct = checksum_memory(spec_, p, n, Deadline::after(std::chrono::seconds(30)));
      ASSERT_TRUE(direct.ok()) << direct.status().to_string();
      EXPECT_EQ(*direct, want);
    }
}

// Several checksums in flight behind one fence keep their own results, and a flipped byte shows.
TEST_P(DeviceChecksum, ManyInFlightKeepTheirOwnResults) {
  constexpr int kN = 24;
  std::vector<Buffer> bufs(kN);
  std::vector<uint32_t> want(kN);
  std::vector<uint64_t> tickets(kN);
  for (int i = 0; i < kN; ++i) want[i] = fill(&bufs[i], 65'536 + 97 * i, i % 5);
  for (int i = 0; i < kN; ++i) {
    auto t = queue_->checksum(static_cast<char*>(bufs[i].data()) + i % 5, 65'536 + 97 * i);
    ASSERT_TRUE(t.ok());
    tickets[i] = *t;
  }
  auto fence = queue_->record();
  ASSERT_TRUE(fence.ok());
  ASSERT_TRUE(queue_->wait(*fence, Deadline::after(std::chrono::seconds(30))).ok());
  for (int i = 0; i < kN; ++i) EXPECT_EQ(queue_->checksum_result(tickets[i]), want[i]) << i;

  unsigned char one = 0;
  ASSERT_TRUE(copy_memory(MemRegion{&one, 1, kHost}, bufs[3].region().sub(3 % 5 + 1000, 1)).ok());
  one ^= 0x10;
  ASSERT_TRUE(copy_memory(bufs[3].region().sub(3 % 5 + 1000, 1), MemRegion{&one, 1, kHost}).ok());
  auto again = checksum_memory(spec_, static_cast<char*>(bufs[3].data()) + 3 % 5, 65'536 + 97 * 3,
                               Deadline::after(std::chrono::seconds(30)));
  ASSERT_TRUE(again.ok());
  EXPECT_NE(*again, want[3]);
}

INSTANTIATE_TEST_SUITE_P(Kinds, DeviceChecksum, ::testing::Values(MemKind::kSim, MemKind::kCuda),
                         [](const auto& info) { return info.param == MemKind::kSim ? "Sim" : "Cuda"; });

}  // namespace
}  // namespace dmx
