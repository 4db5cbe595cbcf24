// The devmem path receiving with io_uring zcrx, over SimNic's zcrx double (tests/devmem/
// sim_zcrx.cc): real bytes on a loopback TCP pair, the receiver's double placing them as buffers
// in the path's dma-buf area with one CQE each and taking them back through the refill ring. Also
// which receiver the path picks, and why (devmem_path_rx.h). Names say "Zcrx".
#include <gtest/gtest.h>

#include "devmem/socket_double.h"
#include "engine/devmem_path_util.h"
#include "engine/test_util.h"
#include "transport/devmem/devmem_path.h"

namespace dmx {
namespace {

using devmem::testing::SimNic;
using devmem::testing::SimNicOptions;
using devmem::testing::ZcrxFault;
using namespace devmem_path_test;
using test::filled;
using test::poisoned;
using test::random_bytes;
using test::read_back;

const MemSpec kSimMem{MemKind::kSim, 0};
const MemSpec kHostMem{MemKind::kHost, 0};

SimNicOptions zcrx_nic(uint64_t seed) {
  SimNicOptions o;
  o.seed = seed;
  o.zcrx = true;
  o.dmabuf_offset = 0;  // the area's dma-buf is exactly the area (the CUDA export of a pool)
  return o;
}

Result<std::unique_ptr<PayloadPath>> path_on(SimNic& nic, UniqueFd fd, const std::string& peer,
                                             std::map<std::string, std::string> settings = {}) {
  return make_devmem_path(std::move(fd), config(settings), peer, nic.seams());
}

DevmemPathCounters counters(const PayloadPath& p) {
  DevmemPathCounters c;
  EXPECT_TRUE(devmem_path_counters(p, &c));
  return c;
}

// Two paths over one TCP pair, each receiving by zcrx on its own SimNic.
struct ZcrxPair {
  SimNic nic_a, nic_b;
  Recorder ev_a, ev_b;
  std::unique_ptr<PayloadPath> a, b;
  explicit ZcrxPair(std::map<std::string, std::string> settings = {}, SimNicOptions oa = zcrx_nic(41),
                    SimNicOptions ob = zcrx_nic(42))
      : nic_a(oa), nic_b(ob) {
    auto [x, y] = tcp_pair();
    auto pa = path_on(nic_a, std::move(x), "host-b", settings);
    auto pb = path_on(nic_b, std::move(y), "host-a", settings);
    EXPECT_TRUE(pa.ok() && pb.ok()) << pa.status().to_string() << " / " << pb.status().to_string();
    if (!pa.ok() || !pb.ok()) return;
    a = std::move(*pa), b = std::move(*pb);
    a->start(&ev_a, nullptr);
    b->start(&ev_b, nullptr);
  }
  ~ZcrxPair() {
    if (a) a->stop();
    if (b) b->stop();
  }
  // Sends each size from a to b (fresh random data) with every chunk in flight at once, checks
  // every byte.
  void transfer(const std::vector<size_t>& sizes) {
    std::vector<test::Filled> src;
    std::vector<Buffer> dst;
    for (size_t i = 0; i < sizes.size(); ++i) {
      src.push_back(filled(kSimMem, sizes[i]));
      dst.push_back(poisoned(i % 2 ? kSimMem : kHostMem, sizes[i]));
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      ASSERT_TRUE(b->post_rx(seq_ + i, desc(sizes[i]), dst[i].region()).ok());
      auto d = a->post_tx(seq_ + i, src[i].buf.region(), true);
      ASSERT_TRUE(d.ok()) << d.status().to_string();
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      Status t = ev_a.tx(seq_ + i), r = ev_b.rx(seq_ + i);
      ASSERT_TRUE(t.ok()) << t.to_string();
      ASSERT_TRUE(r.ok()) << r.to_string();
      ASSERT_TRUE(read_back(dst[i].region()) == src[i].data) << "chunk " << i << " of " << sizes[i] << " bytes differs";
    }
    seq_ += sizes.size();
  }
  void expect_clean() {
    a->stop();
    b->stop();
    EXPECT_TRUE(ev_a.wait_stopped());
    EXPECT_TRUE(ev_b.wait_stopped());
    EXPECT_TRUE(ev_a.failed().empty());
    EXPECT_TRUE(ev_b.failed().empty());
    EXPECT_TRUE(ev_b.exactly_once());
    a.reset(), b.reset();
    for (SimNic* n : {&nic_a, &nic_b}) {
      auto z = n->zcrx_counts();
      EXPECT_EQ(z.bad_refills, 0u) << "a buffer given back twice or made up";
      EXPECT_EQ(z.ifqs, 0u) << "the ifq outlived its path";
      EXPECT_EQ(n->outstanding_tokens(), 0u);
    }
  }
  uint64_t seq_ = 0;
};

TEST(ZcrxPathDouble, ExactBytesOfOddSizesZeroAndManyChunks) {
  ZcrxPair pp;
  ASSERT_TRUE(pp.a && pp.b);
  std::vector<size_t> sizes = {1, 4097, (1 << 20) + 3, 0, 4096, 12345, 7};
  for (size_t left = (40u << 20) + 3; left > 0;) {  // cut into max_chunk pieces, as the endpoint does
    size_t n = std::min<size_t>(left, pp.a->max_chunk());
    sizes.push_back(n);
    left -= n;
  }
  pp.transfer(sizes);
  pp.transfer({0, 333333, 1});  // and again, on the same ifq
  DevmemPathCounters c = counters(*pp.b);
  size_t total = 0;
  for (size_t s : sizes) total += s;
  total += 333334;
  EXPECT_EQ(c.zcrx_bytes, total);
  EXPECT_GT(c.zcrx_cqes, total / 4096);
  EXPECT_EQ(c.fragments, 0u) << "devmem RX was used";
  EXPECT_EQ(c.zcrx_buffers_held, 0u);
  EXPECT_GT(c.zcrx_arms, 1u) << "the double ends the multishot now and then: it must be re-armed";
  EXPECT_NE(c.rx_note.find("zcrx: queue 12 of simdev0"), std::string::npos) << c.rx_note;
  EXPECT_NE(pp.b->describe().find("RX by zcrx: queue 12"), std::string::npos) << pp.b->describe();
  EXPECT_EQ(pp.b->stats().bytes_received, total);
  EXPECT_GT(pp.nic_b.zcrx_counts().multishot_ends, 0u);
  pp.expect_clean();
}

// An area of 256 buffers for 48 MiB: only buffers given back let it finish; refills are batched.
TEST(ZcrxPathDouble, RefillPressureWithASmallArea) {
  ZcrxPair pp(std::map<std::string, std::string>{{"devmem_rx_pool", "1M"}});
  ASSERT_TRUE(pp.a && pp.b);
  pp.transfer({16u << 20, (16u << 20) - 1, 16u << 20, 4093});
  DevmemPathCounters c = counters(*pp.b);
  EXPECT_GT(c.zcrx_refills, 256u * 40) << "buffers were not reused";
  EXPECT_LT(c.zcrx_refill_flushes, c.zcrx_refills / 8) << "refills were not batched";
  EXPECT_GE(pp.nic_b.zcrx_counts().refilled + pp.nic_b.zcrx_counts().held, c.zcrx_cqes - 1);
  pp.expect_clean();
}

TEST(ZcrxPathDouble, BothDirectionsAtOnce) {
  ZcrxPair pp;
  ASSERT_TRUE(pp.a && pp.b);
  const size_t n = (8u << 20) + 5;
  auto s1 = filled(kSimMem, n), s2 = filled(kSimMem, n);
  Buffer d1 = poisoned(kHostMem, n), d2 = poisoned(kHostMem, n);
  ASSERT_TRUE(pp.a->post_tx(0, s1.buf.region(), true).ok());
  ASSERT_TRUE(pp.b->post_tx(0, s2.buf.region(), true).ok());
  ASSERT_TRUE(pp.b->post_rx(0, desc(n), d1.region()).ok());
  ASSERT_TRUE(pp.a->post_rx(0, desc(n), d2.region()).ok());
  ASSERT_TRUE(pp.ev_b.rx(0).ok());
  ASSERT_TRUE(pp.ev_a.rx(0).ok());
  EXPECT_TRUE(read_back(d1.region()) == s1.data);
  EXPECT_TRUE(read_back(d2.region()) == s2.data);
  pp.expect_clean();
}

// Which receiver, and why not the other: each refusal as the kernel words it.
struct Pick {
  Status status;
  std::string note;
};
Pick pick(SimNicOptions o, std::map<std::string, std::string> settings = {},
          const std::function<void(SimNic&)>& prepare = nullptr) {
  SimNic nic(o);
  if (prepare) prepare(nic);
  auto [x, y] = tcp_pair();
  auto p = path_on(nic, std::move(y), "peer:1", std::move(settings));
  if (!p.ok()) return {p.status(), ""};
  return {Status(), counters(**p).rx_note};
}

TEST(ZcrxPathDouble, FallbackReasons) {
  SimNicOptions o = zcrx_nic(5);
  {
    Pick p = pick(o);
    ASSERT_TRUE(p.status.ok()) << p.status.to_string();
    EXPECT_EQ(p.note.rfind("zcrx: queue 12", 0), 0u) << p.note;
  }
  {  // 6.14: no such register opcode: EINVAL, and devmem RX receives
    SimNicOptions old = o;
    old.kernel_minor = 14;
    Pick p = pick(old);
    ASSERT_TRUE(p.status.ok()) << p.status.to_string();
    EXPECT_EQ(p.note.rfind("devmem RX: queues 12-13", 0), 0u) << p.note;
    EXPECT_NE(p.note.find("zcrx not used: zcrx: sim IORING_REGISTER_ZCRX_IFQ"), std::string::npos) << p.note;
    EXPECT_NE(p.note.find("before Linux 6.15"), std::string::npos) << p.note;
    EXPECT_NE(p.note.find("(errno 22)"), std::string::npos) << p.note;
  }
  {  // 6.15: zcrx, but no dma-buf areas
    SimNicOptions old = o;
    old.kernel_minor = 15;
    Pick p = pick(old);
    ASSERT_TRUE(p.status.ok()) << p.status.to_string();
    EXPECT_NE(p.note.find("IORING_ZCRX_AREA_DMABUF"), std::string::npos) << p.note;
    EXPECT_NE(p.note.find("(errno 22)"), std::string::npos) << p.note;
  }
  {  // the first queue has a memory provider (EEXIST): the next one
    Pick p = pick(o, {}, [](SimNic& n) { static std::shared_ptr<void> held; held = n.occupy_queues({12}); });
    ASSERT_TRUE(p.status.ok()) << p.status.to_string();
    EXPECT_EQ(p.note.rfind("zcrx: queue 13", 0), 0u) << p.note;
  }
  {  // every queue has one: no zcrx, and devmem RX cannot bind them either
    std::shared_ptr<void> held;
    Pick p = pick(o, {}, [&](SimNic& n) { held = n.occupy_queues({12, 13}); });
    ASSERT_FALSE(p.status.ok());
    EXPECT_EQ(p.status.code(), Code::kUnavailable) << p.status.to_string();
    EXPECT_NE(p.status.message().find("devmem: no free RX queue"), std::string::npos) << p.status.to_string();
    EXPECT_NE(p.status.message().find("zcrx not used: zcrx: no free queue"), std::string::npos) << p.status.to_string();
    EXPECT_NE(p.status.message().find("(errno 17)"), std::string::npos) << p.status.to_string();
  }
  {  // no queue API: EOPNOTSUPP for both
    Pick p = pick(o, {}, [](SimNic& n) { n.set_queue_api(false); });
    ASSERT_FALSE(p.status.ok());
    EXPECT_NE(p.status.message().find("no queue API for memory providers failed: Operation not supported (errno 95)"), std::string::npos)
        << p.status.to_string();
  }
  {  // a dma-buf that starts before the area: the kernel would take memory that is not ours
    SimNicOptions off = o;
    off.dmabuf_offset = 8192;
    Pick p = pick(off);
    ASSERT_TRUE(p.status.ok()) << p.status.to_string();
    EXPECT_NE(p.note.find("zcrx not used: zcrx: the area's dma-buf covers"), std::string::npos) << p.note;
  }
  {  // the setting
    Pick p = pick(o, {{"devmem_rx", "devmem"}});
    ASSERT_TRUE(p.status.ok()) << p.status.to_string();
    EXPECT_NE(p.note.find("zcrx not used: devmem_rx=devmem"), std::string::npos) << p.note;
  }
  {  // zcrx only: a refusal fails the path with the reason
    SimNicOptions old = o;
    old.kernel_minor = 14;
    Pick p = pick(old, {{"devmem_rx", "zcrx"}});
    ASSERT_FALSE(p.status.ok());
    EXPECT_NE(p.status.message().find("devmem_rx=zcrx: zcrx: sim IORING_REGISTER_ZCRX_IFQ"), std::string::npos)
        << p.status.to_string();
  }
  {  // seams without zcrx (the plain SimNic)
    SimNicOptions none = o;
    none.zcrx = false;
    Pick p = pick(none);
    ASSERT_TRUE(p.status.ok()) << p.status.to_string();
    EXPECT_NE(p.note.find("zcrx not used: zcrx: these seams have no zcrx"), std::string::npos) << p.note;
  }
}

// One ifq per path: two paths take both queues, a third finds none (and devmem RX none either).
TEST(ZcrxPathDouble, OneQueuePerPathUntilNoneIsLeft) {
  SimNic nic(zcrx_nic(6));
  auto [x1, y1] = tcp_pair();
  auto [x2, y2] = tcp_pair();
  auto [x3, y3] = tcp_pair();
  auto p1 = path_on(nic, std::move(y1), "p1");
  auto p2 = path_on(nic, std::move(y2), "p2");
  ASSERT_TRUE(p1.ok() && p2.ok());
  EXPECT_EQ(counters(**p1).rx_note.rfind("zcrx: queue 12", 0), 0u);
  EXPECT_EQ(counters(**p2).rx_note.rfind("zcrx: queue 13", 0), 0u);
  EXPECT_EQ(nic.zcrx_counts().ifqs, 2u);
  auto p3 = path_on(nic, std::move(y3), "p3");
  ASSERT_FALSE(p3.ok());
  EXPECT_NE(p3.status().message().find("no free queue"), std::string::npos) << p3.status().to_string();
  p1->reset();
  EXPECT_EQ(nic.zcrx_counts().ifqs, 1u) << "the queue is free again once its path is gone";
}

// A receiving path whose peer is a raw socket, and the double hands it a hostile completion.
void expect_hostile_cqe_fails(ZcrxFault fault, Code code, const std::string& text) {
  SimNic nic(zcrx_nic(7));
  Recorder ev;
  auto [raw, y] = tcp_pair();
  auto p = path_on(nic, std::move(y), "evil-peer:7");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  auto& path = *p;
  path->start(&ev, nullptr);
  Buffer d = poisoned(kHostMem, 1 << 20);
  ASSERT_TRUE(path->post_rx(0, desc(1 << 20), d.region()).ok());
  nic.zcrx_fault_next(fault);
  auto bytes = random_bytes(1 << 20);
  for (size_t at = 0; at < bytes.size();) {
    ssize_t n = ::send(raw.get(), bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n <= 0) break;  // the path failed and closed the connection
    at += static_cast<size_t>(n);
  }
  ASSERT_TRUE(ev.wait_failed());
  Status f = ev.failed().front();
  EXPECT_EQ(f.code(), code) << f.to_string();
  EXPECT_NE(f.message().find(text), std::string::npos) << f.to_string();
  EXPECT_EQ(f.peer(), "evil-peer:7") << f.to_string();
  Status r = ev.rx(0);
  EXPECT_EQ(r.code(), code) << r.to_string();
  path->stop();
  EXPECT_TRUE(ev.wait_stopped());
  EXPECT_EQ(ev.failed().size(), 1u);
  path.reset();
  EXPECT_EQ(nic.zcrx_counts().ifqs, 0u);
  EXPECT_EQ(nic.zcrx_counts().bad_refills, 0u);
}

TEST(ZcrxPathDouble, HostileCompletionsFailThePathOnce) {
  expect_hostile_cqe_fails(ZcrxFault::kUnknownArea, Code::kProtocol, "buffer of unknown area");
  expect_hostile_cqe_fails(ZcrxFault::kOutsideArea, Code::kOutOfRange, "outside our");
  expect_hostile_cqe_fails(ZcrxFault::kLongerThanArea, Code::kOutOfRange, "outside our");
  expect_hostile_cqe_fails(ZcrxFault::kForeignTag, Code::kProtocol, "completion for unknown request");
  expect_hostile_cqe_fails(ZcrxFault::kErrorCqe, Code::kIo, "IORING_OP_RECV_ZC");
}

TEST(ZcrxPathDouble, PeerCloseMidTransferFailsThePendingChunk) {
  SimNic nic(zcrx_nic(8));
  Recorder ev;
  auto [raw, y] = tcp_pair();
  auto p = path_on(nic, std::move(y), "peer:9");
  ASSERT_TRUE(p.ok());
  (*p)->start(&ev, nullptr);
  Buffer d = poisoned(kHostMem, 100000);
  ASSERT_TRUE((*p)->post_rx(0, desc(100000), d.region()).ok());
  auto bytes = random_bytes(60000);
  ASSERT_EQ(::send(raw.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL), 60000);
  raw.reset();
  Status r = ev.rx(0);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.message().find("60000 of 100000"), std::string::npos) << r.to_string();
  (*p)->stop();
  EXPECT_TRUE(ev.wait_stopped());
}

}  // namespace
}  // namespace dmx
