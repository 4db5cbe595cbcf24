// Seed 002's rule for rdma on captured server layouts (tests/fixtures/topo): the verbs device's
// NIC against each GPU, GPUDirect only below a shared PCIe switch, the arithmetic in the reason.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "topo/topology.h"
#include "transport/rdma/advice.h"

namespace dmx::rdma {
namespace {

std::string fixture(const char* name) {
  const char* root = std::getenv("DMX_TEST_FIXTURES");
  return std::string(root ? root : "tests/fixtures") + "/topo/" + name;
}

TEST(RdmaAdvice, ServerLayoutsDecideGpuDirectPerGpu) {
  int direct = 0, staged = 0;
  for (const char* f : {"dual-socket-icelake", "switch-cascade-amd"}) {
    auto t = topo::discover(fixture(f));
    ASSERT_TRUE(t.ok()) << f << ": " << t.status().to_string();
    auto a = advise_gpus(*t, "mlx5_0");
    ASSERT_TRUE(a.ok()) << f << ": " << a.status().to_string();
    ASSERT_FALSE(a->empty()) << f;
    for (const GpuAdvice& g : *a) {
      (g.direct ? direct : staged)++;
      EXPECT_NE(g.why.find("send: "), std::string::npos) << g.why;
      EXPECT_NE(g.why.find("receive: "), std::string::npos) << g.why;
    }
  }
  // Both verdicts occur across the two layouts.
  EXPECT_GT(direct, 0);
  EXPECT_GT(staged, 0);
}

TEST(RdmaAdvice, SoftwareDeviceIsNotConsulted) {
  auto t = topo::discover(fixture("dual-socket-icelake"));
  ASSERT_TRUE(t.ok());
  auto a = advise_gpus(*t, "rxe0");
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("not a PCI function"), std::string::npos) << a.status().message();
}

}  // namespace
}  // namespace dmx::rdma
