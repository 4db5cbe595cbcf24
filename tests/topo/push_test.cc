// The GPU push advisor (topo/push.h): the modes, the size rule, and the seed-002 read/write split.
#include "topo/push.h"

#include <gtest/gtest.h>

namespace dmx::topo {
namespace {

TEST(GpuPush, ParsesModes) {
  EXPECT_EQ(*parse_push_mode("auto"), PushMode::kAuto);
  EXPECT_EQ(*parse_push_mode("on"), PushMode::kOn);
  EXPECT_EQ(*parse_push_mode("off"), PushMode::kOff);
  auto bad = parse_push_mode("yes");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'yes'"), std::string::npos);
}

TEST(GpuPush, OffNeverAndOnUpToTheLimit) {
  for (PushLink link : {PushLink::kPeerGpu, PushLink::kHostWrite, PushLink::kHostRead}) {
    PushFacts f = push_facts(link, "SYS");
    PushPlan off = plan_gpu_push(PushMode::kOff, 16384, f);
    EXPECT_FALSE(off.push(8));
    EXPECT_NE(off.why.find("gpu_push=off"), std::string::npos);
    PushPlan on = plan_gpu_push(PushMode::kOn, 16384, f);
    EXPECT_TRUE(on.push(8));
    EXPECT_TRUE(on.push(kPushLimit));
    EXPECT_FALSE(on.push(kPushLimit + 1));
    EXPECT_FALSE(on.push(0));
    EXPECT_NE(on.why.find("gpu_push=on"), std::string::npos);
  }
}

TEST(GpuPush, AutoPushesWritesUpToTheSetting) {
  for (PushLink link : {PushLink::kPeerGpu, PushLink::kHostWrite}) {
    PushPlan p = plan_gpu_push(PushMode::kAuto, 16384, push_facts(link));
    EXPECT_TRUE(p.push(1));
    EXPECT_TRUE(p.push(16384));
    EXPECT_FALSE(p.push(16385));
    EXPECT_NE(p.why.find("16 KiB"), std::string::npos) << p.why;
    EXPECT_NE(p.why.find("posted writes"), std::string::npos) << p.why;
  }
  // The setting is clamped to what the SM copy takes.
  EXPECT_EQ(plan_gpu_push(PushMode::kAuto, uint64_t{1} << 40, PushFacts{}).max, kPushLimit);
  EXPECT_EQ(plan_gpu_push(PushMode::kAuto, 0, PushFacts{}).max, 0u);
}

TEST(GpuPush, AutoReadsOnlySmallAndNeverAcrossSockets) {
  PushPlan near = plan_gpu_push(PushMode::kAuto, 16384, push_facts(PushLink::kHostRead, "PHB"));
  EXPECT_EQ(near.max, 4096u);
  EXPECT_NE(near.why.find("completions of 64 B"), std::string::npos) << near.why;
  EXPECT_NE(near.why.find("path PHB"), std::string::npos) << near.why;
  PushPlan far = plan_gpu_push(PushMode::kAuto, 16384, push_facts(PushLink::kHostRead, "SYS"));
  EXPECT_FALSE(far.push(8));
  EXPECT_NE(far.why.find("across sockets"), std::string::npos) << far.why;
  // Writes across sockets are still posted: pushed.
  EXPECT_TRUE(plan_gpu_push(PushMode::kAuto, 16384, push_facts(PushLink::kHostWrite, "SYS")).push(8));
}

}  // namespace
}  // namespace dmx::topo
