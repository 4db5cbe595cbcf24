// devmem RX logic against the kernel test double (every machine). Names say "Double".
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <random>

#include "devmem/kernel_double.h"
#include "memory/backend.h"
#include "transport/devmem/region.h"
#include "transport/devmem/rx.h"
#include "transport/devmem/tokens.h"
#include "test_env.h"

namespace dmx::devmem {
namespace {

using testing::KernelDouble;
using testing::RxLayout;

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

Deadline soon() { return Deadline::after(std::chrono::seconds(10)); }

// Feeds `data` to the double in pieces, as a peer would, whenever the receiver would block.
struct Feeder {
  KernelDouble* k;
  std::vector<uint8_t> data;
  RxLayout layout;
  size_t at = 0;
  size_t piece = 256 << 10;
  void install() {
    k->on_idle = [this] {
      if (at >= data.size()) return;
      size_t n = std::min(piece, data.size() - at);
      std::vector<uint8_t> chunk(data.begin() + static_cast<long>(at), data.begin() + static_cast<long>(at + n));
      if (k->inject(chunk, layout)) at += n;
    };
  }
};

struct RxHarness {
  KernelDouble k{16 << 20, 42};
  std::unique_ptr<Gatherer> gatherer = make_host_gatherer();
  RxPool pool() { return RxPool{42, 0, MemRegion{k.pool(), k.pool_size(), {MemKind::kHost, 0}}}; }
  std::unique_ptr<DevmemRx> make(RxOptions o = {}) {
    auto rx = DevmemRx::create(&k, pool(), gatherer.get(), o);
    EXPECT_TRUE(rx.ok()) << rx.status().to_string();
    return std::move(rx).value();
  }
};

TEST(TokenPlanDouble, MergesConsecutiveAndRespectsKernelLimits) {
  std::vector<uint32_t> t;
  for (uint32_t i = 0; i < 3000; ++i) t.push_back(i);  // one long run
  auto calls = plan_dontneed(t);
  size_t total = 0;
  for (const auto& c : calls) {
    size_t frags = 0;
    for (const auto& r : c) frags += r.token_count;
    EXPECT_LE(c.size(), abi::kMaxDontneedTokens);
    EXPECT_LE(frags, abi::kMaxDontneedFrags);
    total += frags;
  }
  EXPECT_EQ(total, 3000u);
  EXPECT_EQ(calls.size(), 3u);  // 1024 + 1024 + 952, one range each
  std::vector<uint32_t> sparse;
  for (uint32_t i = 0; i < 300; ++i) sparse.push_back(i * 2);  // nothing merges
  calls = plan_dontneed(sparse);
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].size(), 128u);
  // No merge across the u32 wrap.
  calls = plan_dontneed({0xffffffffu, 0u});
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].size(), 2u);
}

TEST(RxDouble, GathersScatteredFragmentsIntoHostMemory) {
  RxHarness h;
  auto data = random_bytes(8 << 20, 1);
  Feeder f{&h.k, data, RxLayout{4096, 0, 4096, false}};
  f.install();
  auto rx = h.make();
  std::vector<uint8_t> out(data.size());
  ASSERT_TRUE(rx->receive(MemRegion{out.data(), out.size(), {}}, soon()).ok()) << rx->error().to_string();
  EXPECT_EQ(out, data);
  EXPECT_EQ(h.k.user_tokens(), 0u);
  EXPECT_EQ(rx->outstanding_tokens(), 0u);
  EXPECT_LE(h.k.max_ranges_per_call, abi::kMaxDontneedTokens);
  EXPECT_LE(h.k.max_frags_per_call, abi::kMaxDontneedFrags);
  EXPECT_EQ(rx->stats().devmem_bytes, data.size());
  EXPECT_EQ(rx->stats().tokens.returned, rx->stats().frags);
  EXPECT_EQ(rx->stats().tokens.unknown, 0u);
}

TEST(RxDouble, LinearChunksAreCopiedAndCounted) {
  RxHarness h;
  auto data = random_bytes(3 << 20, 2);
  Feeder f{&h.k, data, RxLayout{1448, 0.3, 4096, false}};
  f.install();
  auto rx = h.make();
  std::vector<uint8_t> out(data.size());
  ASSERT_TRUE(rx->receive(MemRegion{out.data(), out.size(), {}}, soon()).ok()) << rx->error().to_string();
  EXPECT_EQ(out, data);
  EXPECT_GT(rx->stats().linear_bytes, 0u);
  EXPECT_EQ(rx->stats().linear_bytes + rx->stats().devmem_bytes, data.size());
  EXPECT_EQ(h.k.user_tokens(), 0u);
}

// The sim device's copies run later on a worker: a token returned before its copy finished would
// let the double scribble the page first, and the comparison would fail.
TEST(RxDouble, TokensReturnOnlyAfterAsyncGatherIntoSimMemory) {
  RxHarness h;
  auto data = random_bytes(6 << 20, 3);
  Feeder f{&h.k, data, RxLayout{4096, 0.05, 4096, false}};
  f.install();
  RxOptions o;
  o.max_outstanding_frags = 64;  // forces waiting on the oldest gathers mid-message
  o.recv_chunk = 64 << 10;
  auto rx = h.make(o);
  auto dst = Buffer::allocate({MemKind::kSim, 0}, data.size());
  ASSERT_TRUE(dst.ok());
  for (int rep = 0; rep < 2; ++rep) {
    f.at = 0;
    ASSERT_TRUE(rx->receive(dst->region(), soon()).ok()) << rx->error().to_string();
    std::vector<uint8_t> back(data.size());
    ASSERT_TRUE(copy_memory(MemRegion{back.data(), back.size(), {}}, dst->region()).ok());
    EXPECT_EQ(back, data) << "rep " << rep;
  }
  EXPECT_EQ(h.k.user_tokens(), 0u);
}

TEST(RxDouble, ShortControlBufferGrowsOnEtoosmall) {
  RxHarness h;
  auto data = random_bytes(1 << 20, 4);
  ASSERT_TRUE(h.k.inject(data, RxLayout{}));
  RxOptions o;
  o.control_size = 16;  // smaller than one cmsg: the kernel answers ETOOSMALL (525)
  auto rx = h.make(o);
  std::vector<uint8_t> out(data.size());
  ASSERT_TRUE(rx->receive(MemRegion{out.data(), out.size(), {}}, soon()).ok()) << rx->error().to_string();
  EXPECT_EQ(out, data);
  EXPECT_GE(h.k.etoosmall, 1u);
  EXPECT_GE(rx->stats().control_grows, 1u);
  EXPECT_EQ(h.k.user_tokens(), 0u);
}

// Defect 6: before 6.14 the kernel said EFAULT where it now says ETOOSMALL. On such kernels
// (efault_may_mean_small_control, set from the running kernel's version) EFAULT grows the control
// buffer; at control_max it stays fatal, and on a 6.14+ kernel it is fatal at once.
TEST(DevmemRxDouble, EfaultOnPre614KernelsGrowsTheControlBuffer) {
  auto data = random_bytes((1 << 20) + 77, 14);
  {
    RxHarness h;
    h.k.legacy_cmsg = true;
    ASSERT_TRUE(h.k.inject(data, RxLayout{}));
    RxOptions o;
    o.control_size = 16;
    o.efault_may_mean_small_control = true;
    auto rx = h.make(o);
    std::vector<uint8_t> out(data.size());
    ASSERT_TRUE(rx->receive(MemRegion{out.data(), out.size(), {}}, soon()).ok()) << rx->error().to_string();
    EXPECT_EQ(out, data);
    EXPECT_GE(rx->stats().control_grows, 1u);
    EXPECT_EQ(h.k.user_tokens(), 0u);
  }
  {  // at control_max, EFAULT is fatal and says why it may be
    RxHarness h;
    h.k.legacy_cmsg = true;
    ASSERT_TRUE(h.k.inject(data, RxLayout{}));
    RxOptions o;
    o.control_size = 16;
    o.control_max = 16;
    o.efault_may_mean_small_control = true;
    auto rx = h.make(o);
    std::vector<uint8_t> out(data.size());
    Status s = rx->receive(MemRegion{out.data(), out.size(), {}}, soon());
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("pre-6.14"), std::string::npos) << s.to_string();
  }
  {  // a 6.14+ kernel: EFAULT means what it says
    RxHarness h;
    h.k.legacy_cmsg = true;
    ASSERT_TRUE(h.k.inject(data, RxLayout{}));
    RxOptions o;
    o.control_size = 16;
    auto rx = h.make(o);
    std::vector<uint8_t> out(data.size());
    EXPECT_FALSE(rx->receive(MemRegion{out.data(), out.size(), {}}, soon()).ok());
  }
}

TEST(RxDouble, ControlBufferForOneFragmentAtATimeStillWorks) {
  RxHarness h;
  auto data = random_bytes(256 << 10, 5);
  ASSERT_TRUE(h.k.inject(data, RxLayout{}));
  RxOptions o;
  o.control_size = CMSG_SPACE(sizeof(abi::DmabufCmsg));
  o.control_max = o.control_size;
  auto rx = h.make(o);
  std::vector<uint8_t> out(data.size());
  ASSERT_TRUE(rx->receive(MemRegion{out.data(), out.size(), {}}, soon()).ok()) << rx->error().to_string();
  EXPECT_EQ(out, data);
  EXPECT_EQ(rx->stats().recv_calls, rx->stats().frags);  // one cmsg per call: short counts
}

TEST(RxDouble, PlainTcpDataFromAnUnboundQueueIsCounted) {
  RxHarness h;
  auto data = random_bytes(100000, 6);
  h.k.inject_plain(data);
  auto rx = h.make();
  std::vector<uint8_t> out(data.size());
  ASSERT_TRUE(rx->receive(MemRegion{out.data(), out.size(), {}}, soon()).ok());
  EXPECT_EQ(out, data);
  EXPECT_GE(rx->stats().plain_calls, 1u);
  EXPECT_EQ(rx->stats().linear_bytes, data.size());
}

TEST(RxDouble, UnknownDmabufIdFailsAndReturnsEveryToken) {
  RxHarness h;
  auto data = random_bytes(512 << 10, 7);
  ASSERT_TRUE(h.k.inject(data, RxLayout{}));
  h.k.corrupt_id = 99;
  auto rx = h.make();
  std::vector<uint8_t> out(data.size());
  Status s = rx->receive(MemRegion{out.data(), out.size(), {}}, soon());
  EXPECT_EQ(s.code(), Code::kProtocol) << s.to_string();
  EXPECT_NE(s.message().find("unknown dmabuf id 99"), std::string::npos) << s.message();
  EXPECT_EQ(h.k.user_tokens(), 0u);
  // Sticky: the receive side stays failed.
  EXPECT_EQ(rx->receive(MemRegion{out.data(), out.size(), {}}, soon()).code(), Code::kProtocol);
}

TEST(RxDouble, FragmentOutsideTheBoundBufferFailsWithoutCopying) {
  RxHarness h;
  ASSERT_TRUE(h.k.inject(random_bytes(64 << 10, 8), RxLayout{}));
  h.k.corrupt_offset = true;
  auto rx = h.make();
  std::vector<uint8_t> out(64 << 10);
  Status s = rx->receive(MemRegion{out.data(), out.size(), {}}, soon());
  EXPECT_EQ(s.code(), Code::kOutOfRange) << s.to_string();
  EXPECT_EQ(h.k.user_tokens(), 0u);
}

TEST(RxDouble, TokenOverflowFailsAndCloseReleasesTheRest) {
  RxHarness h;
  ASSERT_TRUE(h.k.inject(random_bytes(64 << 10, 9), RxLayout{}));
  h.k.corrupt_token = true;
  auto rx = h.make();
  std::vector<uint8_t> out(64 << 10);
  Status s = rx->receive(MemRegion{out.data(), out.size(), {}}, soon());
  EXPECT_EQ(s.code(), Code::kProtocol) << s.to_string();
  // The corrupted token cannot be named back; all others were returned, and socket close frees it.
  EXPECT_LE(h.k.user_tokens(), 1u);
  h.k.close_socket();
  EXPECT_EQ(h.k.user_tokens(), 0u);
}

TEST(RxDouble, PeerSendingMoreThanAnnouncedFails) {
  RxHarness h;
  auto data = random_bytes(128 << 10, 10);
  ASSERT_TRUE(h.k.inject(data, RxLayout{}));
  auto rx = h.make();
  std::vector<uint8_t> out(100 << 10);  // the peer announced 100 KiB
  ASSERT_TRUE(rx->receive(MemRegion{out.data(), out.size(), {}}, soon()).ok());
  EXPECT_EQ(0, std::memcmp(out.data(), data.data(), out.size()));
  Status s = rx->reject_unexpected();
  EXPECT_EQ(s.code(), Code::kProtocol);
  EXPECT_NE(s.message().find("more than it announced"), std::string::npos);
  EXPECT_EQ(h.k.user_tokens(), 0u);
}

TEST(RxDouble, EfaultAndPeerCloseAndTimeoutAreClearErrors) {
  {
    RxHarness h;
    ASSERT_TRUE(h.k.inject(random_bytes(8192, 11), RxLayout{}));
    h.k.fail_next_recv = EFAULT;
    auto rx = h.make();
    std::vector<uint8_t> out(8192);
    Status s = rx->receive(MemRegion{out.data(), out.size(), {}}, soon());
    EXPECT_NE(s.message().find("EFAULT"), std::string::npos) << s.to_string();
  }
  {
    RxHarness h;
    ASSERT_TRUE(h.k.inject(random_bytes(8192, 12), RxLayout{}));
    h.k.peer_closed = true;
    auto rx = h.make();
    std::vector<uint8_t> out(16384);
    EXPECT_EQ(rx->receive(MemRegion{out.data(), out.size(), {}}, soon()).code(), Code::kClosed);
    EXPECT_EQ(h.k.user_tokens(), 0u);
  }
  {
    RxHarness h;
    auto rx = h.make();
    std::vector<uint8_t> out(100);
    auto t0 = Clock::now();
    EXPECT_EQ(rx->receive(MemRegion{out.data(), out.size(), {}}, Deadline::after(std::chrono::milliseconds(50))).code(),
              Code::kTimeout);
    EXPECT_LT(Clock::now() - t0, test::kLoadSlack);
  }
}

TEST(KernelDoubleSelfCheck, DontneedFollowsTheKernelContract) {
  KernelDouble k(1 << 20, 1);
  ASSERT_TRUE(k.inject(random_bytes(64 << 10, 13), RxLayout{4096, 0, 4096, true}));
  std::vector<uint8_t> lin(64 << 10);
  std::vector<uint8_t> ctrl(64 << 10);
  iovec iov{lin.data(), lin.size()};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctrl.data();
  m.msg_controllen = ctrl.size();
  EXPECT_EQ(k.recvmsg(&m, 0), -EFAULT);  // devmem data without MSG_SOCK_DEVMEM
  m.msg_controllen = ctrl.size();
  EXPECT_EQ(k.recvmsg(&m, abi::kMsgSockDevmem), 64 << 10);
  EXPECT_EQ(k.user_tokens(), 16u);
  abi::DmabufToken bad[129] = {};
  EXPECT_EQ(k.setsockopt(SOL_SOCKET, abi::kSoDevmemDontneed, bad, sizeof bad), -EINVAL);
  EXPECT_EQ(k.setsockopt(SOL_SOCKET, abi::kSoDevmemDontneed, bad, 7), -EINVAL);
  abi::DmabufToken all{0, 20};  // 16 known, 4 unknown: a count, not 0
  EXPECT_EQ(k.setsockopt(SOL_SOCKET, abi::kSoDevmemDontneed, &all, sizeof all), 16);
  EXPECT_EQ(k.user_tokens(), 0u);
}

// BoundRegion ties the dmabuf export and the binding together; releasing it unbinds.
TEST(BoundRegionDouble, BindingLivesExactlyAsLongAsTheRegion) {
  testing::NetlinkDouble nl;
  std::vector<uint8_t> mem(1 << 20);
  MemRegion region{mem.data(), mem.size(), {}};
  auto exporter = [&nl](MemRegion r) -> Result<DmabufExport> {
    DmabufExport e;
    e.fd = nl.dmabufs.make(r.size);
    e.size = r.size;
    return e;
  };
  uint32_t queues[] = {6, 7};
  {
    auto rx = BoundRegion::bind_rx(nl, nl.nic.ifindex, queues, region, exporter);
    ASSERT_TRUE(rx.ok());
    EXPECT_EQ(nl.open_bindings.size(), 1u);
    EXPECT_EQ((*rx)->rx_pool().dmabuf_id, (*rx)->id());
    ASSERT_EQ(nl.rx_queues_seen.size(), 1u);
    EXPECT_EQ(nl.rx_queues_seen[0], std::vector<uint32_t>({6, 7}));
  }
  EXPECT_TRUE(nl.open_bindings.empty());
  nl.tx_error = Status(Code::kUnavailable, "netdev bind-tx(ifindex 2) failed: Operation not supported (errno 95); "
                                           "kernel: Driver does not support netmem TX");
  auto tx = BoundRegion::bind_tx(nl, 2, region, exporter);
  EXPECT_FALSE(tx.ok());
  EXPECT_NE(tx.status().message().find("Driver does not support netmem TX"), std::string::npos);
  EXPECT_TRUE(nl.open_bindings.empty());
}

}  // namespace
}  // namespace dmx::devmem

namespace dmx::devmem {
namespace {

// Hand-made control buffers for what the double never produces on its own.
struct CmsgBuilder {
  std::vector<uint8_t> buf = std::vector<uint8_t>(4096, 0);
  size_t used = 0;
  void add(int level, int type, const void* data, size_t len) {
    auto* c = reinterpret_cast<cmsghdr*>(buf.data() + used);
    c->cmsg_level = level;
    c->cmsg_type = type;
    c->cmsg_len = CMSG_LEN(len);
    std::memcpy(CMSG_DATA(c), data, len);
    used += CMSG_SPACE(len);
  }
  void frag(uint64_t off, uint32_t size, uint32_t token, uint32_t id = 42) {
    abi::DmabufCmsg d{off, size, token, id, 0};
    add(SOL_SOCKET, abi::kScmDevmemDmabuf, &d, sizeof d);
  }
  msghdr msg() {
    msghdr m{};
    m.msg_control = buf.data();
    m.msg_controllen = used;
    return m;
  }
};

RxPool test_pool() {
  static std::vector<uint8_t> mem(1 << 20);
  return RxPool{42, 4096, MemRegion{mem.data(), mem.size(), {}}};
}

TEST(ParseRecvDouble, OffsetsAreRelativeToWhereThePoolStartsInTheDmabuf) {
  CmsgBuilder b;
  b.frag(4096 + 100, 1000, 5);
  b.frag(4096 + 8192, 4096, 6);
  msghdr m = b.msg();
  ParsedRecv p;
  ASSERT_TRUE(parse_recv(m, 5096, 8192, test_pool(), 777, &p).ok());
  ASSERT_EQ(p.frags.size(), 2u);
  EXPECT_EQ(p.frags[0].src_offset, 100u);
  EXPECT_EQ(p.frags[0].dst_offset, 777u);
  EXPECT_EQ(p.frags[1].src_offset, 8192u);
  EXPECT_EQ(p.frags[1].dst_offset, 1777u);
  EXPECT_EQ(p.tokens, std::vector<uint32_t>({5, 6}));
}

TEST(ParseRecvDouble, MalformedControlMessagesAreRejectedButTokensKept) {
  {  // fragment before the pool's start in the dmabuf
    CmsgBuilder b;
    b.frag(100, 1000, 1);
    msghdr m = b.msg();
    ParsedRecv p;
    EXPECT_EQ(parse_recv(m, 1000, 4096, test_pool(), 0, &p).code(), Code::kOutOfRange);
    EXPECT_EQ(p.tokens.size(), 1u);
  }
  {  // byte counts that do not add up to the return value
    CmsgBuilder b;
    b.frag(4096, 1000, 1);
    msghdr m = b.msg();
    ParsedRecv p;
    EXPECT_EQ(parse_recv(m, 2000, 4096, test_pool(), 0, &p).code(), Code::kProtocol);
  }
  {  // more than asked for
    CmsgBuilder b;
    b.frag(4096, 4096, 1);
    msghdr m = b.msg();
    ParsedRecv p;
    EXPECT_EQ(parse_recv(m, 4096, 1000, test_pool(), 0, &p).code(), Code::kProtocol);
  }
  {  // oversized fragment, a foreign cmsg, a short devmem cmsg, a truncated control area
    CmsgBuilder b;
    b.frag(4096, 5000, 1);
    int x = 0;
    b.add(SOL_IP, 1, &x, sizeof x);
    b.add(SOL_SOCKET, abi::kScmDevmemDmabuf, &x, sizeof x);
    b.frag(4096, 10, 2);
    msghdr m = b.msg();
    ParsedRecv p;
    EXPECT_EQ(parse_recv(m, 5010, 8192, test_pool(), 0, &p).code(), Code::kProtocol);
    EXPECT_EQ(p.tokens, std::vector<uint32_t>({1, 2}));
    m.msg_flags = MSG_CTRUNC;
    ParsedRecv q;
    EXPECT_EQ(parse_recv(m, 10, 8192, test_pool(), 0, &q).code(), Code::kProtocol);
  }
  {  // a linear chunk overrunning the iov
    CmsgBuilder b;
    abi::DmabufCmsg d{0, 9000, 0, 0, 0};
    b.add(SOL_SOCKET, abi::kScmDevmemLinear, &d, sizeof d);
    msghdr m = b.msg();
    ParsedRecv p;
    EXPECT_EQ(parse_recv(m, 9000, 9000 - 1, test_pool(), 0, &p).code(), Code::kProtocol);
  }
}

}  // namespace
}  // namespace dmx::devmem
