#include "topo/advisor.h"

#include <gtest/gtest.h>

#include "topo/report.h"
#include "topo/topo_fixture.h"

namespace dmx::topo {
namespace {

using testing::dev;
using testing::load;

TEST(Advisor, PcieArithmetic) {
  // Posted writes, 256 B payloads: 256 / (256 + 24) = 91.4 %.
  EXPECT_NEAR(write_efficiency(256, 256), 0.914, 0.001);
  EXPECT_NEAR(write_efficiency(4096, 128), 128.0 / 152.0, 1e-9);
  EXPECT_NEAR(write_efficiency(4096, 512), 0.955, 0.001);
  // Reads completed in 64 B pieces: 64 / (64 + 20) = 76.2 %; 128 B: 86.5 %; 256 B: 92.8 %.
  EXPECT_NEAR(read_efficiency(256, 64), 0.762, 0.001);
  EXPECT_NEAR(read_efficiency(4096, 128), 0.865, 0.001);
  EXPECT_NEAR(read_efficiency(512, 256), 0.928, 0.001);
  // The Intel application note's example: 512 B read in two 256 B completions.
  EXPECT_NEAR(read_efficiency(512, 256), 512.0 / 552.0, 1e-9);
  // Partial last TLP.
  EXPECT_NEAR(write_efficiency(300, 256), 300.0 / (300 + 48), 1e-9);
  EXPECT_EQ(write_efficiency(0, 256), 0);
  EXPECT_EQ(read_efficiency(100, 0), 0);
}

TEST(Advisor, SwitchPairGoesDirectOtherwiseStageNearTheGpu) {
  Topology t = load("dual-socket-icelake");
  int gpu0 = dev(t, "0000:03:00.0"), gpu1 = dev(t, "0000:83:00.0");
  int ens1 = t.nic_by_name("ens1"), ens2 = t.nic_by_name("ens2");
  for (Direction d : {Direction::kSend, Direction::kReceive}) {
    Advice a = advise(t, gpu0, ens1, d);
    EXPECT_EQ(a.verdict, Verdict::kNicDirect) << a.why;
    EXPECT_EQ(a.path.cls, PathClass::kPix);
    Advice acs = advise(t, gpu1, ens2, d);  // ACS redirect in the switch
    EXPECT_EQ(acs.verdict, Verdict::kStageHost) << acs.why;
    EXPECT_EQ(acs.staging_numa, 1);
    EXPECT_NE(acs.why.find("ACS"), std::string::npos);
    Advice cross = advise(t, gpu0, ens2, d);
    EXPECT_EQ(cross.verdict, Verdict::kStageHost);
    EXPECT_EQ(cross.staging_numa, 0);
    EXPECT_EQ(cross.path.cls, PathClass::kSys);
  }
  Advice send = advise(t, gpu0, ens2, Direction::kSend);
  EXPECT_EQ(send.rcb, 64u);  // through the root complex: its RCB (64 B, Link Control bit clear)
  EXPECT_NEAR(send.direct_efficiency, 64.0 / 84.0, 1e-9);
  EXPECT_NEAR(send.staged_efficiency, 256.0 / 280.0, 0.001);
  EXPECT_NE(send.why.find("76.2 %"), std::string::npos) << send.why;
  EXPECT_EQ(advise_all(t).size(), 8u);  // 2 GPUs x 2 NICs x 2 directions
}

TEST(Advisor, GpuVmStagesEverything) {
  Topology t = load("gpu-vm");
  auto all = advise_all(t);
  ASSERT_EQ(all.size(), 4u);
  for (const Advice& a : all) {
    EXPECT_EQ(a.verdict, Verdict::kStageHost) << a.why;
    EXPECT_EQ(a.staging_numa, 0);
    EXPECT_EQ(a.p2pdma.map, MapType::kNotSupported);
  }
}

TEST(Advisor, CascadeUsesRootPortRcbOnlyThroughTheRootComplex) {
  Topology t = load("switch-cascade-amd");
  int nic = t.nic_by_name("ens7f0np0");
  Advice direct = advise(t, dev(t, "0000:05:00.0"), nic, Direction::kSend);
  EXPECT_EQ(direct.verdict, Verdict::kNicDirect) << direct.why;
  EXPECT_EQ(direct.path.cls, PathClass::kPxb);
  EXPECT_EQ(direct.rcb, 128u);  // below the root complex: the GPU completes (128 B device RCB)
  Advice ec = advise(t, dev(t, "0000:06:00.0"), nic, Direction::kSend);
  EXPECT_EQ(ec.verdict, Verdict::kStageHost) << ec.why;
  EXPECT_EQ(ec.rcb, 128u);  // root port 00:01.1 has RCB 128 set
}

// Seed 002 per GPU, as `dmx topo` prints it: each GPU with its nearest RDMA NIC, GPUDirect where
// they share a PCIe switch, staging where they meet at the root complex (haswell: PHB) or where
// ACS sends the traffic through the host bridge (icelake socket 1).
TEST(Advisor, RdmaGpuDirectPerGpuByTheDistanceToItsNearestRdmaNic) {
  Topology ice = load("dual-socket-icelake");
  int g0 = dev(ice, "0000:03:00.0"), g1 = dev(ice, "0000:83:00.0");
  ASSERT_EQ(nearest_rdma_nic(ice, g0), ice.nic_by_name("ens1"));
  ASSERT_EQ(nearest_rdma_nic(ice, g1), ice.nic_by_name("ens2"));
  RdmaChoice near = rdma_choice(ice, g0, ice.nic_by_name("ens1"));
  EXPECT_TRUE(near.gpudirect) << near.why;
  EXPECT_NE(near.why.find("128 B completions (86.5 % of the wire)"), std::string::npos) << near.why;
  RdmaChoice acs = rdma_choice(ice, g1, ice.nic_by_name("ens2"));
  EXPECT_FALSE(acs.gpudirect) << acs.why;
  EXPECT_EQ(acs.staging_numa, 1);
  EXPECT_NE(acs.why.find("64 B completions (76.2 % of the wire)"), std::string::npos) << acs.why;

  Topology has = load("dual-socket-haswell");
  int h0 = dev(has, "0000:02:00.0");
  ASSERT_EQ(nearest_rdma_nic(has, h0), has.nic_by_name("ens2f0"));
  RdmaChoice phb = rdma_choice(has, h0, has.nic_by_name("ens2f0"));
  EXPECT_FALSE(phb.gpudirect) << phb.why;
  EXPECT_NE(phb.why.find("PHB"), std::string::npos) << phb.why;

  std::string text = render_text(ice);
  EXPECT_NE(text.find("RDMA per GPU"), std::string::npos) << text;
  EXPECT_NE(text.find("0000:03:00.0 ens1 (mlx5_0): GPUDirect"), std::string::npos) << text;
  EXPECT_NE(text.find("0000:83:00.0 ens2 (mlx5_1): staged through pinned host memory on NUMA node 1"),
            std::string::npos)
      << text;
  EXPECT_NE(render_json(ice).find("\"rdma_per_gpu\""), std::string::npos);
  // No RDMA device (the GPU machine's capture): no pairing, no GPUDirect.
  Topology vm = load("gpu-h200x2");
  for (int g : vm.gpus) EXPECT_EQ(nearest_rdma_nic(vm, g), -1);
}

}  // namespace
}  // namespace dmx::topo
