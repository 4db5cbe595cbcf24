// The zcrx receiver against a double of the kernel's side of the rings (every machine), and the
// zcrx probe against the running kernel. Names say "Zcrx".
#include <gtest/gtest.h>
#include <net/if.h>

#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "transport/devmem/probe_bind.h"
#include "transport/devmem/kernel.h"
#include "transport/devmem/zcrx.h"
#include "test_env.h"

namespace dmx::devmem {
namespace {

namespace za = zcrx_abi;
constexpr uint32_t kPage = 4096;

// The kernel's side: received bytes land in free 4 KiB buffers of the area (at random offsets in
// the page, at most one page per CQE), one CQE32 each with the area token | offset, while a
// multishot RECV_ZC is armed; refills free buffers (scribbled at once: a consumer that read after
// giving one back sees garbage). A full CQ or no free buffer stops delivery, as the NIC would.
class ZcrxKernelDouble final : public ZcrxKernel {
 public:
  explicit ZcrxKernelDouble(size_t area_pages, uint32_t cq_entries = 64, uint32_t rq_entries = 32, uint64_t seed = 3)
      : area(area_pages * kPage, 0xCC), cq(cq_entries * za::kCqeSize), rqes(rq_entries), rng(seed) {
    rings_.cq_head = &cq_head;
    rings_.cq_tail = &cq_tail;
    rings_.cq_mask = cq_entries - 1;
    rings_.cqes = cq.data();
    rings_.rq_head = &rq_head;
    rings_.rq_tail = &rq_tail;
    rings_.rq_mask = rq_entries - 1;
    rings_.rqes = rqes.data();
    for (uint32_t p = 0; p < area_pages; ++p) free_pages.insert(p);
  }
  static constexpr uint64_t kToken = uint64_t{3} << za::kAreaShift;

  ZcrxRings rings() override { return rings_; }
  uint64_t area_token() const override { return kToken; }
  Status arm(uint64_t user_data) override {
    ++arms;
    armed = true;
    tag = user_data;
    return Status();
  }
  pollfd ready_fd() const override { return {-1, 0, 0}; }
  Status wait(int) override {
    ++waits;
    take_refills();
    if (on_idle) on_idle();
    deliver();
    return Status();
  }

  // Bytes the peer sent; delivered as buffers and CQEs as room allows.
  void send(const std::vector<uint8_t>& d) {
    wire.insert(wire.end(), d.begin(), d.end());
    deliver();
  }
  void deliver() {
    while (armed && !wire.empty() && !free_pages.empty() && cq_tail - cq_head <= rings_.cq_mask) {
      uint32_t page = pick_page();
      uint32_t off = std::uniform_int_distribution<uint32_t>(0, kPage - 1)(rng);
      auto n = static_cast<uint32_t>(std::min<size_t>({wire.size(), kPage - off, max_buf}));
      std::memcpy(area.data() + size_t{page} * kPage + off, wire.data(), n);
      wire.erase(wire.begin(), wire.begin() + n);
      uint64_t o = uint64_t{page} * kPage + off;
      held[o] = n;
      bool more = !(end_multishot_every && ++posted % end_multishot_every == 0);
      post(tag, static_cast<int32_t>(n), more ? za::kCqeFMore : 0, (corrupt_area ? uint64_t{9} << za::kAreaShift : kToken) | (corrupt_offset ? area.size() - 10 : o));
      corrupt_area = corrupt_offset = false;
      if (!more) armed = false;
    }
    if (armed && wire.empty() && peer_closed) {
      post(tag, 0, 0, 0);
      armed = false;
    }
  }
  void post(uint64_t user_data, int32_t res, uint32_t flags, uint64_t off) {
    uint8_t* c = cq.data() + size_t{cq_tail & rings_.cq_mask} * za::kCqeSize;
    io_uring_cqe e{};
    e.user_data = user_data;
    e.res = res;
    e.flags = flags;
    za::ZcrxCqe z{off, 0};
    std::memcpy(c, &e, sizeof e);
    std::memcpy(c + sizeof e, &z, sizeof z);
    __atomic_store_n(&cq_tail, cq_tail + 1, __ATOMIC_RELEASE);
  }
  void take_refills() {
    uint32_t tail = __atomic_load_n(&rq_tail, __ATOMIC_ACQUIRE);
    for (; rq_head != tail; ++rq_head) {
      za::Rqe r = rqes[rq_head & rings_.rq_mask];
      auto it = held.find(r.off & ~za::kAreaMask);
      if ((r.off & za::kAreaMask) != kToken || it == held.end() || it->second != r.len) {
        ++bad_refills;
        continue;
      }
      uint32_t page = static_cast<uint32_t>(it->first / kPage);
      held.erase(it);
      std::memset(area.data() + size_t{page} * kPage, 0xEE, kPage);
      free_pages.insert(page);
      ++refilled;
    }
  }
  uint32_t pick_page() {
    auto it = free_pages.begin();
    std::advance(it, std::uniform_int_distribution<size_t>(0, free_pages.size() - 1)(rng));
    uint32_t p = *it;
    free_pages.erase(it);
    return p;
  }
  MemRegion area_region() { return MemRegion{area.data(), area.size(), {MemKind::kHost, 0}}; }

  std::vector<uint8_t> area, cq;
  std::vector<za::Rqe> rqes;
  uint32_t cq_head = 0, cq_tail = 0, rq_head = 0, rq_tail = 0;
  std::mt19937_64 rng;
  std::set<uint32_t> free_pages;
  std::map<uint64_t, uint32_t> held;  // area offset -> len of buffers the user holds
  std::vector<uint8_t> wire;
  bool armed = false, peer_closed = false, corrupt_area = false, corrupt_offset = false;
  uint64_t tag = 0;
  size_t max_buf = kPage, end_multishot_every = 0, posted = 0, arms = 0, waits = 0, refilled = 0, bad_refills = 0;
  std::function<void()> on_idle;

 private:
  ZcrxRings rings_;
};

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 r(seed);
  for (auto& b : v) b = static_cast<uint8_t>(r());
  return v;
}
Deadline soon() { return Deadline::after(std::chrono::seconds(10)); }

struct Harness {
  ZcrxKernelDouble k;
  std::unique_ptr<Gatherer> g = make_host_gatherer();
  std::unique_ptr<ZcrxRx> rx;
  explicit Harness(size_t pages, ZcrxOptions o = {}) : k(pages) {
    auto r = ZcrxRx::create(&k, k.area_region(), g.get(), o);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    rx = std::move(*r);
  }
};

// Exact bytes across receives of odd sizes (buffers split between them), with an area far
// smaller than the transfer: only buffers given back let it finish; refills go in batches.
TEST(ZcrxDouble, ExactBytesThroughASmallAreaWithBatchedRefills) {
  ZcrxOptions o;
  o.refill_batch = 8;
  Harness h(16, o);
  auto data = random_bytes((1 << 20) + 12345, 1);
  size_t fed = 0;
  h.k.on_idle = [&] {  // the peer keeps sending in pieces
    size_t n = std::min<size_t>(data.size() - fed, 70001);
    h.k.send(std::vector<uint8_t>(data.begin() + fed, data.begin() + fed + n));
    fed += n;
  };
  std::vector<size_t> sizes = {1, 4095, 4097, 333333, 0, 7};
  size_t total = 0;
  for (size_t s : sizes) total += s;
  sizes.push_back(data.size() - total);
  size_t at = 0;
  for (size_t s : sizes) {
    std::vector<uint8_t> out(s, 0x5A);
    ASSERT_TRUE(h.rx->receive(MemRegion{out.data(), out.size(), {}}, soon()).ok()) << h.rx->error().to_string();
    ASSERT_TRUE(std::equal(out.begin(), out.end(), data.begin() + at)) << "receive of " << s << " bytes at " << at;
    at += s;
  }
  EXPECT_EQ(h.rx->buffers_held(), 0u);
  h.k.take_refills();  // what the last flush posted
  EXPECT_EQ(h.k.bad_refills, 0u);
  EXPECT_EQ(h.k.held.size(), 0u);
  EXPECT_GT(h.rx->stats().refills, 256u);
  EXPECT_LT(h.rx->stats().refill_flushes, h.rx->stats().refills / 2) << "refills were not batched";
  EXPECT_EQ(h.rx->stats().bytes, data.size());
}

TEST(ZcrxDouble, MultishotEndedByTheKernelIsRearmed) {
  Harness h(64);
  h.k.end_multishot_every = 5;
  auto data = random_bytes(100003, 2);
  h.k.on_idle = [&] {
    if (!data.empty()) h.k.send(std::exchange(data, {}));
  };
  auto copy = random_bytes(100003, 2);
  std::vector<uint8_t> out(copy.size());
  ASSERT_TRUE(h.rx->receive(MemRegion{out.data(), out.size(), {}}, soon()).ok()) << h.rx->error().to_string();
  EXPECT_EQ(out, copy);
  EXPECT_GT(h.rx->stats().rearms, 3u);
}

TEST(ZcrxDouble, HostileCompletionsFailTheReceiveAndBuffersStillGoBack) {
  {
    Harness h(16);
    h.k.on_idle = [&] {
      if (h.k.wire.empty() && !h.k.posted) {
        h.k.corrupt_area = true;
        h.k.send(random_bytes(5000, 3));
      }
    };
    std::vector<uint8_t> out(5000);
    Status s = h.rx->receive(MemRegion{out.data(), out.size(), {}}, soon());
    EXPECT_EQ(s.code(), Code::kProtocol) << s.to_string();
    EXPECT_NE(s.message().find("unknown area"), std::string::npos) << s.to_string();
    EXPECT_FALSE(h.rx->receive(MemRegion{out.data(), 1, {}}, soon()).ok()) << "errors are sticky";
  }
  {
    Harness h(16);
    h.k.on_idle = [&] {
      if (!h.k.posted) {
        h.k.corrupt_offset = true;
        h.k.send(random_bytes(3000, 4));
      }
    };
    std::vector<uint8_t> out(3000);
    Status s = h.rx->receive(MemRegion{out.data(), out.size(), {}}, soon());
    EXPECT_EQ(s.code(), Code::kOutOfRange) << s.to_string();
  }
  {  // an error completion carries the errno
    Harness h(16);
    h.k.on_idle = [&] {
      if (h.k.armed) h.k.post(h.k.tag, -ENOBUFS, 0, 0), h.k.armed = false;
    };
    std::vector<uint8_t> out(10);
    Status s = h.rx->receive(MemRegion{out.data(), out.size(), {}}, Deadline::after(std::chrono::seconds(2)));
    EXPECT_NE(s.message().find("RECV_ZC"), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find("errno 105"), std::string::npos) << s.to_string();
  }
  {  // the peer closes midway: kClosed with the count; every buffer it held goes back
    Harness h(16);
    auto data = random_bytes(6000, 5);
    h.k.peer_closed = true;
    h.k.on_idle = [&] {
      if (!data.empty()) h.k.send(std::exchange(data, {}));
    };
    std::vector<uint8_t> out(9000);
    Status s = h.rx->receive(MemRegion{out.data(), out.size(), {}}, soon());
    EXPECT_EQ(s.code(), Code::kClosed) << s.to_string();
    EXPECT_NE(s.message().find("6000 of 9000"), std::string::npos) << s.to_string();
    h.rx.reset();
    h.k.take_refills();
    EXPECT_EQ(h.k.held.size(), 0u);
    EXPECT_EQ(h.k.bad_refills, 0u);
  }
  {  // nothing arrives: the deadline, not a hang
    Harness h(16);
    std::vector<uint8_t> out(10);
    Status s = h.rx->receive(MemRegion{out.data(), out.size(), {}}, Deadline::after(std::chrono::milliseconds(50)));
    EXPECT_EQ(s.code(), Code::kTimeout) << s.to_string();
  }
}

// The running kernel (6.18 here, virtio_net): the probe gets as far as the dma-buf import and then
// names the NIC's real obstacle, the queue API that zcrx shares with devmem RX.
TEST(ZcrxRealKernel, ProbeGivesThePreciseRefusal) {
  int ifindex = static_cast<int>(::if_nametoindex("lo"));
  auto ops = make_kernel_netlink_ops();
  Capability rx = ops->detect().bind_rx ? probe_bind_rx(*ops, "lo", ifindex, 0) : Capability{"x", false, "no bind-rx"};
  Capability z = probe_zcrx("lo", ifindex, 0, rx);
  std::printf("%s: %s\n", z.name.c_str(), z.detail.c_str());
  EXPECT_EQ(z.name, "devmem.zcrx[lo]");
  EXPECT_FALSE(z.available);
  if (running_kernel_before(6, 16)) {
    EXPECT_NE(z.detail.find("needs Linux 6.1"), std::string::npos) << z.detail;
    return;
  }
  if (z.detail.find("errno 1)") != std::string::npos) DMX_SKIP(::dmx::test::kNoCapability) << "no CAP_NET_ADMIN: " << z.detail;
  // Either the registration reached the import and the queue API is what is missing, or the
  // kernel refused earlier; either way the errno and what it means are in the reason.
  bool import = z.detail.find("reached the dma-buf import") != std::string::npos;
  if (import) {
    EXPECT_NE(z.detail.find("queue API"), std::string::npos) << z.detail;
  } else {
    EXPECT_NE(z.detail.find("IORING_REGISTER_ZCRX_IFQ"), std::string::npos) << z.detail;
    EXPECT_NE(z.detail.find("(errno "), std::string::npos) << z.detail;
  }
}

}  // namespace
}  // namespace dmx::devmem
