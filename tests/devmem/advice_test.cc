// The topology advisor's word on devmem (src/transport/devmem/advice.h), on captured sysfs trees.
#include "transport/devmem/advice.h"

#include <gtest/gtest.h>

#include "topo/topo_fixture.h"

namespace dmx::devmem {
namespace {

using topo::testing::dev;
using topo::testing::load;

// dual-socket-icelake: GPU 03:00.0 and ens1 share a PCIe switch; ens2 hangs off the other socket.
TEST(DevmemAdvice, SwitchPairIsDirectAcrossSocketsStages) {
  topo::Topology t = load("dual-socket-icelake");
  int gpu0 = dev(t, "0000:03:00.0");
  auto a = advise(t, gpu0, "ens1");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_TRUE(a->direct) << a->why;
  EXPECT_NE(a->why.find("send"), std::string::npos) << a->why;
  EXPECT_NE(a->why.find("receive"), std::string::npos) << a->why;
  auto b = advise(t, gpu0, "ens2");
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->direct) << b->why;
}

TEST(DevmemAdvice, GpuVmStages) {
  topo::Topology t = load("gpu-vm");
  ASSERT_FALSE(t.gpus.empty());
  ASSERT_FALSE(t.nics.empty());
  auto a = advise(t, gpu_device(t, 0), t.nics[0].name);
  if (t.nics[0].pci < 0) {
    EXPECT_EQ(a.status().code(), Code::kNotFound);
    return;
  }
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_FALSE(a->direct) << a->why;
}

TEST(DevmemAdvice, UnknownNicOrGpuIsNamed) {
  topo::Topology t = load("dual-socket-icelake");
  auto a = advise(t, dev(t, "0000:03:00.0"), "nosuch0");
  EXPECT_EQ(a.status().code(), Code::kNotFound);
  EXPECT_NE(a.status().message().find("nosuch0"), std::string::npos);
  EXPECT_EQ(advise(t, -1, "ens1").status().code(), Code::kNotFound);
  // A captured tree has no CUDA overlay: the ordinal-th GPU of the tree stands in.
  EXPECT_EQ(gpu_device(t, 0), t.gpus[0]);
  EXPECT_EQ(gpu_device(t, 99), -1);
}

}  // namespace
}  // namespace dmx::devmem
