// devmem against the running kernel: family/op detection and the bind errors a NIC without
// devmem support produces. Names say "RealKernel". Skipped (with the reason) where the kernel has
// no netdev family or the process lacks CAP_NET_ADMIN.
#include <gtest/gtest.h>
#include <net/if.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "transport/devmem/devmem.h"
#include "transport/devmem/kernel.h"
#include "transport/devmem/nic.h"
#include "stream/socket.h"
#include "test_env.h"

namespace dmx::devmem {
namespace {

std::pair<int, int> kernel_version() {
  utsname u{};
  ::uname(&u);
  int major = 0, minor = 0;
  std::sscanf(u.release, "%d.%d", &major, &minor);
  return {major, minor};
}

// A file descriptor that is not a dmabuf: the checks under test come before the kernel looks at it.
UniqueFd not_a_dmabuf() { return UniqueFd(::memfd_create("not-a-dmabuf", MFD_CLOEXEC)); }

TEST(RealKernel, NetdevFamilyAndBindOps) {
  auto ops = make_kernel_netlink_ops();
  NetdevSupport s = ops->detect();
  if (!s.family) DMX_SKIP(::dmx::test::kOldKernel) << "no netdev genl family: " << s.detail;
  auto [major, minor] = kernel_version();
  std::printf("kernel %d.%d: netdev family; bind-rx op %s, bind-tx op %s\n", major, minor, s.bind_rx ? "yes" : "no",
              s.bind_tx ? "yes" : "no");
  if (major > 6 || (major == 6 && minor >= 12)) {
    EXPECT_TRUE(s.bind_rx);
  }
  if (major > 6 || (major == 6 && minor >= 16)) {
    EXPECT_TRUE(s.bind_tx);
  }
}

TEST(RealKernel, BindTxOnLoopbackIsEopnotsuppWithExtack) {
  auto ops = make_kernel_netlink_ops();
  if (!ops->detect().bind_tx) DMX_SKIP(::dmx::test::kOldKernel) << "no bind-tx op (Linux < 6.16)";
  auto fd = not_a_dmabuf();
  auto b = ops->bind_tx(static_cast<int>(::if_nametoindex("lo")), fd.get());
  ASSERT_FALSE(b.ok());
  std::printf("bind-tx(lo): %s\n", b.status().message().c_str());
  EXPECT_NE(b.status().message().find("errno 95"), std::string::npos) << b.status().message();
  EXPECT_NE(b.status().message().find("kernel: Driver does not support netmem TX"), std::string::npos)
      << b.status().message();
}

TEST(RealKernel, BindRxOnLoopbackIsEopnotsupp) {
  auto ops = make_kernel_netlink_ops();
  if (!ops->detect().bind_rx) DMX_SKIP(::dmx::test::kOldKernel) << "no bind-rx op (Linux < 6.12)";
  auto fd = not_a_dmabuf();
  uint32_t q[] = {0};
  auto b = ops->bind_rx(static_cast<int>(::if_nametoindex("lo")), fd.get(), q);
  ASSERT_FALSE(b.ok());
  std::printf("bind-rx(lo): %s\n", b.status().message().c_str());
  if (b.status().message().find("errno 1)") != std::string::npos) DMX_SKIP(::dmx::test::kNoCapability) << "no CAP_NET_ADMIN: " << b.status().message();
  EXPECT_NE(b.status().message().find("errno 95"), std::string::npos) << b.status().message();
}

TEST(RealKernel, BindRxOnUnknownIfindexIsEnodev) {
  auto ops = make_kernel_netlink_ops();
  if (!ops->detect().bind_rx) DMX_SKIP(::dmx::test::kOldKernel) << "no bind-rx op (Linux < 6.12)";
  auto fd = not_a_dmabuf();
  uint32_t q[] = {0};
  auto b = ops->bind_rx(987654, fd.get(), q);
  ASSERT_FALSE(b.ok());
  if (b.status().message().find("errno 1)") != std::string::npos) DMX_SKIP(::dmx::test::kNoCapability) << "no CAP_NET_ADMIN: " << b.status().message();
  EXPECT_NE(b.status().message().find("errno 19"), std::string::npos) << b.status().message();
}

// Every interface of this machine: what bind-rx/bind-tx answer and the NIC's header-split state.
// Informational (drivers differ); asserts only that each answer carries the kernel's errno text.
TEST(RealKernel, ReportEveryInterface) {
  auto ops = make_kernel_netlink_ops();
  if (!ops->detect().family) DMX_SKIP(::dmx::test::kOldKernel) << "no netdev genl family: " << ops->detect().detail;
  auto fd = not_a_dmabuf();
  for (const auto& e : std::filesystem::directory_iterator("/sys/class/net")) {
    std::string name = e.path().filename();
    int ifindex = static_cast<int>(::if_nametoindex(name.c_str()));
    uint32_t q[] = {0};
    auto rx = ops->bind_rx(ifindex, fd.get(), q);
    auto tx = ops->bind_tx(ifindex, fd.get());
    auto nic = read_nic_state(name);
    std::printf("%-10s driver %-12s bind-rx: %s\n%-10s %-19s bind-tx: %s\n%-10s %-19s nic: %s\n", name.c_str(),
                driver_name(name).c_str(), rx.ok() ? "ok?!" : rx.status().message().c_str(), "", "",
                tx.ok() ? "ok?!" : tx.status().message().c_str(), "", "",
                nic.ok() ? describe(*nic).c_str() : nic.status().message().c_str());
    EXPECT_FALSE(rx.ok());  // a memfd is never a dmabuf
    EXPECT_FALSE(tx.ok());
  }
}

TEST(RealKernel, ProbeReportsReasons) {
  auto caps = probe();
  ASSERT_FALSE(caps.empty());
  for (const auto& c : caps) {
    std::printf("%-32s %-3s %s\n", c.name.c_str(), c.available ? "yes" : "no", c.detail.c_str());
    EXPECT_FALSE(c.detail.empty()) << c.name;
  }
}

}  // namespace
}  // namespace dmx::devmem

namespace dmx::devmem {
namespace {

TEST(RealKernel, UsableSaysWhyNot) {
  EXPECT_NE(usable("").message().find("off"), std::string::npos);
  EXPECT_NE(usable("no-such-if0").message().find("no interface"), std::string::npos);
  Status s = usable("lo");
  EXPECT_FALSE(s.ok());  // loopback can never carry devmem
  EXPECT_EQ(s.code(), Code::kUnavailable);
  std::printf("usable(lo): %s\n", s.message().c_str());
}

// Defect 5: the data socket is bound to the NIC before connect (a bind after connect resets the
// route, and the devmem TX check is on the route). Here with lo, the one interface every machine has.
TEST(DevmemRealKernel, DataSocketIsBoundToTheDeviceBeforeConnect) {
  auto l = stream::listen_on(stream::Address{"127.0.0.1", 0});
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  auto where = stream::parse_address(stream::local_name(l->get()));
  ASSERT_TRUE(where.ok());
  auto fd = stream::connect_to(*where, Deadline::after(std::chrono::seconds(5)), "lo");
  if (!fd.ok() && fd.status().message().find("errno 1)") != std::string::npos)
    DMX_SKIP(::dmx::test::kNoCapability) << "no CAP_NET_RAW for SO_BINDTODEVICE: " << fd.status().message();
  ASSERT_TRUE(fd.ok()) << fd.status().to_string();
  char dev[IFNAMSIZ] = {};
  socklen_t len = sizeof dev;
  ASSERT_EQ(::getsockopt(fd->get(), SOL_SOCKET, SO_BINDTODEVICE, dev, &len), 0);
  EXPECT_STREQ(dev, "lo");
  auto bad = stream::connect_to(*where, Deadline::after(std::chrono::seconds(5)), "nosuchdev0");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("before connect"), std::string::npos) << bad.status().to_string();
}

}  // namespace
}  // namespace dmx::devmem
