// The host checks of dmx_probe. What they find depends on the machine; what they must never do
// is crash, throw, or answer without a reason.
#include "probe/probe.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "test_env.h"

namespace dmx::probe {
namespace {

std::string fixture(const std::string& name) {
  const char* base = std::getenv("DMX_TEST_FIXTURES");
  return std::string(base ? base : "tests/fixtures") + "/topo/" + name;
}

const Capability* find(const std::vector<Capability>& caps, const std::string& name) {
  for (const Capability& c : caps)
    if (c.name == name) return &c;
  return nullptr;
}

void expect_well_formed(const std::vector<Capability>& caps) {
  ASSERT_FALSE(caps.empty());
  for (const Capability& c : caps) {
    EXPECT_FALSE(c.name.empty());
    EXPECT_FALSE(c.detail.empty()) << c.name << " answers without a reason";
  }
}

TEST(Probe, Kernel) {
  auto caps = probe_kernel();
  expect_well_formed(caps);
  const Capability* k = find(caps, "kernel.version");
  ASSERT_NE(k, nullptr);
  EXPECT_TRUE(k->available);
  EXPECT_NE(k->detail.find("Linux"), std::string::npos);
}

TEST(Probe, CudaSaysWhy) {
  auto caps = probe_cuda();
  expect_well_formed(caps);
  const Capability* d = find(caps, "cuda.driver");
  ASSERT_NE(d, nullptr);
  if (!d->available) {
    const Capability* p = find(caps, "cuda.p2p");
    ASSERT_NE(p, nullptr);
    EXPECT_FALSE(p->available);
    DMX_SKIP(::dmx::test::kNoGpu) << d->detail;
  }
}

TEST(Probe, TopologyOfTheGpuVm) {
  auto caps = probe_topology(fixture("gpu-vm"));
  expect_well_formed(caps);
  const Capability* s = find(caps, "topo.sysfs");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->available);
  EXPECT_NE(s->detail.find("2 GPU(s)"), std::string::npos) << s->detail;
  EXPECT_FALSE(find(caps, "topo.p2pdma_host_bridge")->available);  // Intel, 0d57 not whitelisted
  const Capability* r = find(caps, "rdma.devices");
  ASSERT_NE(r, nullptr);
  EXPECT_FALSE(r->available);
  EXPECT_NE(r->detail.find("class/infiniband"), std::string::npos);
  const Capability* g = find(caps, "topo.gpu_nic_direct");
  ASSERT_NE(g, nullptr);
  EXPECT_FALSE(g->available);
  EXPECT_NE(g->detail.find("NOT_SUPPORTED"), std::string::npos) << g->detail;
}

TEST(Probe, TopologyWithSwitchPairs) {
  auto caps = probe_topology(fixture("dual-socket-icelake"));
  expect_well_formed(caps);
  const Capability* g = find(caps, "topo.gpu_nic_direct");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(g->available);
  EXPECT_NE(g->detail.find("2 of 8"), std::string::npos) << g->detail;
  EXPECT_TRUE(find(caps, "rdma.devices")->available);
  EXPECT_TRUE(find(probe_topology(fixture("switch-cascade-amd")), "topo.p2pdma_host_bridge")->available);
}

TEST(Probe, TopologyOfANonTree) {
  auto caps = probe_topology("/nonexistent/sysfs");
  ASSERT_EQ(caps.size(), 1u);
  EXPECT_FALSE(caps[0].available);
  EXPECT_NE(caps[0].detail.find("does not exist"), std::string::npos);
}

TEST(Probe, IoUringAndNamespacesAnswer) {
  auto z = probe_io_uring_zcrx();
  expect_well_formed(z);
  EXPECT_EQ(z[0].name, "io_uring.zcrx");
  auto n = probe_network_namespaces();
  expect_well_formed(n);
  EXPECT_EQ(n[0].name, "netns");
}

}  // namespace
}  // namespace dmx::probe
