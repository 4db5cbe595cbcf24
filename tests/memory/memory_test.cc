#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "memory/backend.h"
#include "memory/copy_queues.h"
#include "test_env.h"

namespace dmx {
namespace {

std::vector<unsigned char> random_data(size_t n) {
  std::vector<unsigned char> v(n);
  std::mt19937_64 rng(std::random_device{}());
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

TEST(MemSpec, Parse) {
  EXPECT_EQ(parse_mem_spec("host")->kind, MemKind::kHost);
  EXPECT_EQ(parse_mem_spec("cuda:3")->device, 3);
  EXPECT_EQ(parse_mem_spec("sim")->kind, MemKind::kSim);
  EXPECT_FALSE(parse_mem_spec("host:1").ok());
  EXPECT_FALSE(parse_mem_spec("cuda:x").ok());
  EXPECT_FALSE(parse_mem_spec("fpga").ok());
  EXPECT_EQ(to_string(MemSpec{MemKind::kCuda, 1}), "cuda:1");
}

TEST(SimMemory, RoundTripThroughCopyInterface) {
  for (size_t n : {size_t{1}, size_t{4097}, size_t{3 << 20}}) {
    auto dev = Buffer::allocate({MemKind::kSim, 0}, n);
    ASSERT_TRUE(dev.ok()) << dev.status().to_string();
    auto src = random_data(n);
    std::vector<unsigned char> back(n, 0);
    ASSERT_TRUE(copy_memory(dev->region(), MemRegion{src.data(), n, {}}).ok());
    ASSERT_TRUE(copy_memory(MemRegion{back.data(), n, {}}, dev->region()).ok());
    EXPECT_EQ(0, std::memcmp(src.data(), back.data(), n)) << n;
  }
}

TEST(SimMemory, DeviceToDeviceAndOffsets) {
  size_t n = 100003;
  auto a = Buffer::allocate({MemKind::kSim, 0}, n);
  auto b = Buffer::allocate({MemKind::kSim, 1}, n);
  ASSERT_TRUE(a.ok() && b.ok());
  auto src = random_data(n);
  ASSERT_TRUE(copy_memory(a->region(), MemRegion{src.data(), n, {}}).ok());
  ASSERT_TRUE(copy_memory(b->region().sub(7, n - 7), a->region().sub(0, n - 7)).ok());
  std::vector<unsigned char> back(n - 7);
  ASSERT_TRUE(copy_memory(MemRegion{back.data(), back.size(), {}}, b->region().sub(7, n - 7)).ok());
  EXPECT_EQ(0, std::memcmp(src.data(), back.data(), back.size()));
}

TEST(SimMemory, OutOfBoundsCopyIsAnError) {
  auto dev = Buffer::allocate({MemKind::kSim, 0}, 4096);
  ASSERT_TRUE(dev.ok());
  std::vector<char> host(8192);
  Status s = copy_memory(MemRegion{host.data(), 8192, {}}, MemRegion{dev->data(), 8192, {MemKind::kSim, 0}});
  EXPECT_EQ(s.code(), Code::kOutOfRange);
}

TEST(SimMemory, DirectTouchFaults) {
  auto dev = Buffer::allocate({MemKind::kSim, 0}, 4096);
  ASSERT_TRUE(dev.ok());
  volatile char* p = static_cast<char*>(dev->data());
  EXPECT_DEATH({ (void)p[0]; }, "");
}

TEST(SimMemory, FencesCompleteInOrder) {
  auto backend = backend_for({MemKind::kSim, 0});
  ASSERT_TRUE(backend.ok());
  auto q = (*backend)->create_queue();
  ASSERT_TRUE(q.ok());
  auto dev = Buffer::allocate({MemKind::kSim, 0}, 1 << 20);
  auto src = random_data(1 << 20);
  ASSERT_TRUE((*q)->to_device(dev->data(), src.data(), src.size()).ok());
  auto f1 = (*q)->record();
  auto f2 = (*q)->record();
  ASSERT_TRUE(f1.ok() && f2.ok());
  EXPECT_EQ(*f2, *f1 + 1);
  ASSERT_TRUE((*q)->wait(*f2, Deadline::after(std::chrono::seconds(10))).ok());
  EXPECT_TRUE(*(*q)->done(*f1));
}

// The cache hands out one queue per (kind, device, lane); lanes are independent in-order queues.
TEST(CopyQueues, LanesAreDistinctQueuesOfOneDevice) {
  constexpr MemSpec kSim0{MemKind::kSim, 0}, kSim1{MemKind::kSim, 1};
  CopyQueues qs;
  bool made = false;
  auto q0 = qs.get(kSim0, &made);
  ASSERT_TRUE(q0.ok()) << q0.status().to_string();
  EXPECT_TRUE(made);
  auto again = qs.get(kSim0, 0, &made);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(made);
  EXPECT_EQ(*again, *q0);  // lane 0 is the device's queue
  auto q1 = qs.get(kSim0, 1, &made);
  auto q2 = qs.get(kSim0, CopyQueues::kMaxLanes - 1, &made);
  ASSERT_TRUE(q1.ok() && q2.ok());
  EXPECT_TRUE(made);
  EXPECT_NE(*q1, *q0);
  EXPECT_NE(*q2, *q1);
  EXPECT_EQ(*qs.get(kSim0, 1), *q1);
  for (int bad : {-1, CopyQueues::kMaxLanes}) {
    auto q = qs.get(kSim0, bad, &made);
    ASSERT_FALSE(q.ok()) << bad;
    EXPECT_EQ(q.status().code(), Code::kInvalidArgument);
    EXPECT_NE(q.status().message().find("lane " + std::to_string(bad)), std::string::npos) << q.status().message();
    EXPECT_FALSE(made);
  }
  ASSERT_TRUE(qs.get(kSim1, 2).ok());
  auto devices = qs.devices();  // each device once, however many lanes it has
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0], kSim0);
  EXPECT_EQ(devices[1], kSim1);

  // Each lane keeps its own fence numbers; drain covers every lane.
  const size_t n = 65537;
  auto dev = Buffer::allocate(kSim0, 3 * n);
  ASSERT_TRUE(dev.ok());
  auto src = random_data(3 * n);
  std::vector<unsigned char> back(3 * n, 0);
  CopyQueue* lanes[] = {*q0, *q1, *q2};
  for (size_t i = 0; i < 3; ++i) {
    char* d = static_cast<char*>(dev->data()) + i * n;
    ASSERT_TRUE(lanes[i]->to_device(d, src.data() + i * n, n).ok());
    auto f = lanes[i]->record();
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(*f, 1u);
    ASSERT_TRUE(lanes[i]->to_host(back.data() + i * n, d, n).ok());
  }
  ASSERT_TRUE(qs.drain(Deadline::after(std::chrono::seconds(10))).ok());
  EXPECT_EQ(0, std::memcmp(src.data(), back.data(), back.size()));
}

TEST(HostMemory, PinnedOrCudaUnavailableSaysWhy) {
  Status s = mem_available({MemKind::kCuda, 0});
  if (s.ok()) DMX_SKIP(::dmx::test::kHasGpu) << "this test covers machines without one";
  EXPECT_EQ(s.code(), Code::kUnavailable);
  EXPECT_FALSE(s.message().empty());
}

}  // namespace
}  // namespace dmx
