// The devmem probe's bind attempts against the faithful NetlinkDouble (every machine).
#include <gtest/gtest.h>
#include <sys/mman.h>

#include "devmem/kernel_double.h"
#include "transport/devmem/probe_bind.h"

namespace dmx::devmem {
namespace {

using testing::NetlinkDouble;

Result<UniqueFd> no_udmabuf() { return Status(Code::kUnavailable, "open(/dev/udmabuf) failed: No such file"); }

// Defect 1: on a capable NIC the kernel refuses the probe's memfd in dma_buf_get() with EINVAL and
// no message; that means every device check passed, so devmem is available (and the reason says
// the import itself was not tried). The old probe called this "unavailable".
TEST(DevmemProbeDouble, MemfdRefusedAsNotADmabufMeansTheDeviceIsCapable) {
  NetlinkDouble nl;
  Capability rx = probe_bind_rx(nl, "eth1", nl.nic.ifindex, 0);
  EXPECT_TRUE(rx.available) << rx.detail;
  EXPECT_NE(rx.detail.find("device checks passed"), std::string::npos) << rx.detail;
  EXPECT_NE(rx.detail.find("not a dma-buf"), std::string::npos) << rx.detail;
  Capability tx = probe_bind_tx(nl, "eth1", nl.nic.ifindex, no_udmabuf);
  EXPECT_TRUE(tx.available) << tx.detail;
  EXPECT_NE(tx.detail.find("no udmabuf"), std::string::npos) << tx.detail;
  EXPECT_TRUE(nl.open_bindings.empty());
}

// With /dev/udmabuf, bind-tx is tried for real (it restarts nothing) and released at once.
TEST(DevmemProbeDouble, TxWithARealDmabufBindsAndReleases) {
  NetlinkDouble nl;
  Capability tx = probe_bind_tx(nl, "eth1", nl.nic.ifindex, [&] { return Result<UniqueFd>(nl.dmabufs.make(4096)); });
  EXPECT_TRUE(tx.available) << tx.detail;
  EXPECT_NE(tx.detail.find("udmabuf"), std::string::npos) << tx.detail;
  EXPECT_NE(tx.detail.find("bound and released"), std::string::npos) << tx.detail;
  EXPECT_TRUE(nl.open_bindings.empty());
}

TEST(DevmemProbeDouble, IncapableDevicesSayWhy) {
  {
    NetlinkDouble nl;
    nl.nic.queue_api = false;
    Capability c = probe_bind_rx(nl, "eth1", nl.nic.ifindex, 0);
    EXPECT_FALSE(c.available);
    EXPECT_NE(c.detail.find("no queue API"), std::string::npos) << c.detail;
  }
  {
    NetlinkDouble nl;
    nl.nic.netmem_tx = false;
    Capability c = probe_bind_tx(nl, "eth1", nl.nic.ifindex, [&] { return Result<UniqueFd>(nl.dmabufs.make(4096)); });
    EXPECT_FALSE(c.available);
    EXPECT_NE(c.detail.find("no netmem TX"), std::string::npos) << c.detail;
    EXPECT_NE(c.detail.find("Driver does not support netmem TX"), std::string::npos) << c.detail;
  }
  {  // queue id beyond the NIC's: EINVAL with a bad attribute, not "capable"
    NetlinkDouble nl;
    Capability c = probe_bind_rx(nl, "eth1", nl.nic.ifindex, 99);
    EXPECT_FALSE(c.available) << c.detail;
    EXPECT_NE(c.detail.find("queue id"), std::string::npos) << c.detail;
  }
  {
    NetlinkDouble nl;
    Capability c = probe_bind_rx(nl, "eth9", nl.nic.ifindex + 1, 0);
    EXPECT_FALSE(c.available);
    EXPECT_NE(c.detail.find("no such device"), std::string::npos) << c.detail;
  }
}

// A GPU dma-buf the exporter will not let the NIC attach (NVIDIA's topology check) says so.
TEST(DevmemProbeDouble, GpuDmabufAttachRefusalIsNamed) {
  Status s = testing::kernel_bind_error("netdev bind-tx(ifindex 2, dmabuf fd 5)", 524);
  Capability c = classify_bind("devmem.bind_tx_gpu[eth1]", s, true, ProbeFd::kGpuDmabuf);
  EXPECT_FALSE(c.available);
  EXPECT_NE(c.detail.find("PCIe topology"), std::string::npos) << c.detail;
  EXPECT_NE(c.detail.find("GPU memory"), std::string::npos) << c.detail;
  Capability ok = classify_bind("devmem.bind_tx_gpu[eth1]", Status(), true, ProbeFd::kGpuDmabuf);
  EXPECT_TRUE(ok.available);
  EXPECT_NE(ok.detail.find("bound and released"), std::string::npos) << ok.detail;
}

// What the faithful double answers, in the kernel's order (the facts the probe relies on).
TEST(DevmemKernelDouble, BindErrorsComeInTheKernelsOrder) {
  NetlinkDouble nl;
  UniqueFd memfd = nl.dmabufs.make(0);
  UniqueFd not_dmabuf(::memfd_create("x", MFD_CLOEXEC));
  UniqueFd dmabuf = nl.dmabufs.make(1 << 20);
  uint32_t q[] = {3};
  auto e1 = nl.bind_rx(nl.nic.ifindex, not_dmabuf.get(), q);
  EXPECT_NE(e1.status().message().find("(errno 22)"), std::string::npos) << e1.status().to_string();
  EXPECT_EQ(e1.status().message().find("kernel:"), std::string::npos) << "dma_buf_get sets no extack";
  auto e2 = nl.bind_rx(nl.nic.ifindex, 9999, q);
  EXPECT_NE(e2.status().message().find("(errno 9)"), std::string::npos) << e2.status().to_string();
  auto b = nl.bind_rx(nl.nic.ifindex, dmabuf.get(), q);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  auto e3 = nl.bind_rx(nl.nic.ifindex, dmabuf.get(), q);
  EXPECT_NE(e3.status().message().find("(errno 17)"), std::string::npos) << e3.status().to_string();
  EXPECT_NE(e3.status().message().find("designated queue already memory provider bound"), std::string::npos);
  b->reset();
  nl.nic.hds_on = false;
  auto e4 = nl.bind_rx(nl.nic.ifindex, dmabuf.get(), q);
  EXPECT_NE(e4.status().message().find("tcp-data-split is disabled"), std::string::npos) << e4.status().to_string();
}

}  // namespace
}  // namespace dmx::devmem
