// devmem TX logic against the kernel test double (every machine). Names say "Double".
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "devmem/kernel_double.h"
#include "transport/devmem/tx.h"

namespace dmx::devmem {
namespace {

using testing::KernelDouble;

Deadline soon() { return Deadline::after(std::chrono::seconds(10)); }

struct TxHarness {
  KernelDouble k{4096, 1};
  TxHarness(size_t size = 8 << 20) {
    k.set_tx_binding(9, size, "eth1");
    k.route_dev = "eth1";  // bound to the NIC before connect (the engine's data socket)
    std::mt19937_64 rng(5);
    for (auto& b : k.tx_dmabuf()) b = static_cast<uint8_t>(rng());
  }
  std::unique_ptr<DevmemTx> make(TxOptions o = {}) {
    if (o.ifname.empty()) o.ifname = "eth1";
    auto tx = DevmemTx::create(&k, TxBindingInfo{9, k.tx_dmabuf().size()}, o);
    EXPECT_TRUE(tx.ok()) << tx.status().to_string();
    return std::move(tx).value();
  }
};

TEST(TxDouble, SendsFromDmabufOffsetsAndCompletes) {
  TxHarness h;
  h.k.tx_window = 300000;  // partial sends and EAGAIN at the window's edge
  TxOptions o;
  o.max_send = 1 << 20;
  auto tx = h.make(o);
  auto t1 = tx->send(4096, 3 << 20, soon());
  ASSERT_TRUE(t1.ok()) << t1.status().to_string();
  auto t2 = tx->send(0, 1000, soon());
  ASSERT_TRUE(t2.ok());
  ASSERT_TRUE(tx->wait(*t1, soon()).ok());
  ASSERT_TRUE(tx->wait(*t2, soon()).ok());
  auto& mem = h.k.tx_dmabuf();
  std::vector<uint8_t> want(mem.begin() + 4096, mem.begin() + 4096 + (3 << 20));
  want.insert(want.end(), mem.begin(), mem.begin() + 1000);
  EXPECT_EQ(h.k.wire, want);
  EXPECT_EQ(tx->inflight_sends(), 0u);
  EXPECT_GT(tx->stats().sendmsg_calls, 3u);  // the window forced partial sends
  EXPECT_EQ(tx->stats().sendmsg_calls, h.k.next_zc_id());
  EXPECT_EQ(tx->stats().spurious, 0u);
}

TEST(TxDouble, RegionIsNotReusedBeforeItsCompletion) {
  TxHarness h;
  h.k.auto_complete = false;
  TxOptions o;
  o.max_send = 64 << 10;
  auto tx = h.make(o);
  auto t = tx->send(0, 256 << 10, soon());
  ASSERT_TRUE(t.ok());
  std::vector<uint8_t> original(h.k.tx_dmabuf().begin(), h.k.tx_dmabuf().begin() + (256 << 10));
  ASSERT_TRUE(tx->poll_completions().ok());
  EXPECT_FALSE(tx->completed(*t));
  // Waiting for the region times out while the NIC still holds it.
  EXPECT_EQ(tx->wait_region_free(1000, 10, Deadline::after(std::chrono::milliseconds(20))).code(), Code::kTimeout);
  h.k.complete(2);  // ids 0 and 1 of 4
  h.k.auto_complete = true;
  ASSERT_TRUE(tx->wait_region_free(0, 256 << 10, soon()).ok());
  // Only now may the caller overwrite; the wire carries the original bytes.
  std::fill(h.k.tx_dmabuf().begin(), h.k.tx_dmabuf().begin() + (256 << 10), 0);
  EXPECT_EQ(h.k.wire, original);
}

TEST(TxDouble, CoalescedCompletionRangesCompleteEverySend) {
  TxHarness h;
  h.k.auto_complete = false;
  TxOptions o;
  o.max_send = 4096;
  auto tx = h.make(o);
  std::vector<uint64_t> tickets;
  for (int i = 0; i < 100; ++i) {
    auto t = tx->send(uint64_t(i) * 8192, 8192, soon());  // two sendmsg calls each
    ASSERT_TRUE(t.ok());
    tickets.push_back(*t);
  }
  h.k.complete(200);  // one coalesced [0, 199] notification
  ASSERT_TRUE(tx->poll_completions().ok());
  for (auto t : tickets) EXPECT_TRUE(tx->completed(t));
  EXPECT_EQ(tx->stats().notifications, 1u);
}

TEST(TxDouble, KernelErrorsAreExplained) {
  {  // route through another device than the binding's: ENODEV
    TxHarness h;
    h.k.route_dev = "eth0";
    TxOptions o;
    o.ifname = "eth1";
    auto tx = DevmemTx::create(&h.k, TxBindingInfo{9, h.k.tx_dmabuf().size()}, o);
    ASSERT_TRUE(tx.ok());
    auto t = (*tx)->send(0, 100, soon());
    EXPECT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("bound NIC"), std::string::npos) << t.status().to_string();
    EXPECT_NE(t.status().message().find("before connect"), std::string::npos) << t.status().to_string();
  }
  {  // unknown binding id: EINVAL
    TxHarness h;
    TxOptions o;
    o.ifname = "eth1";
    auto tx = DevmemTx::create(&h.k, TxBindingInfo{10, h.k.tx_dmabuf().size()}, o);
    ASSERT_TRUE(tx.ok());
    auto t = (*tx)->send(0, 100, soon());
    EXPECT_NE(t.status().message().find("binding id unknown"), std::string::npos) << t.status().to_string();
  }
  {  // outside the dmabuf: refused before the kernel is asked
    TxHarness h;
    auto tx = h.make();
    EXPECT_EQ(tx->send(h.k.tx_dmabuf().size() - 10, 11, soon()).status().code(), Code::kOutOfRange);
    EXPECT_EQ(h.k.next_zc_id(), 0u);
  }
}

// Defect 5: SO_BINDTODEVICE on a connected socket resets its route, and kernels before the
// late-2025 fix then refuse every devmem send with ENODEV. DevmemTx must never do it: a socket
// bound (or routed) through the NIC before connect sends.
TEST(DevmemTxDouble, NoBindToDeviceAfterConnect) {
  TxHarness h;
  auto tx = h.make();  // ifname eth1, the binding's device
  auto t = tx->send(0, 4097, soon());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(h.k.route_resets, 0u);
  ASSERT_TRUE(tx->wait(*t, soon()).ok());
  EXPECT_TRUE(std::equal(h.k.wire.begin(), h.k.wire.end(), h.k.tx_dmabuf().begin()));
  EXPECT_EQ(h.k.wire.size(), 4097u);
}

}  // namespace
}  // namespace dmx::devmem
