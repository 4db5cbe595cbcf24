// The rdma path on its own (transport/rdma/rdma_path.h): two paths of one process joined by a
// socket pair (the data socket's stand-in) over a real verbs device — soft-RoCE in
// scripts/rxe-vm.sh's guest. Hostile-peer cases: a WRITE with a bad rkey or outside the window
// the receiver gave, queue-pair numbers that are not the peer's, small SENDs past the credits (a
// flood), a region deregistered under a WRITE in flight; and the life cycle: RNR retry, credits'
// backpressure, a flood of small chunks, a peer that dies, a prompt stop. Skips with the reason
// where there is no device (this machine's kernel has no RDMA); RdmaRegions and RdmaWire need none.
#include <gtest/gtest.h>

#include "test_env.h"

#if DMX_HAVE_RDMA
#include <sys/socket.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "rdma_test_util.h"
#include "transport/rdma/device.h"
#include "transport/rdma/p2pmem.h"
#include "transport/rdma/rdma_path.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/rdma/setup.h"

namespace dmx::rdma {
namespace {

using namespace std::chrono_literals;

TEST_F(RdmaPathTest, ChunksLandByteExactStripedOverQueuePairs) {
  connect();
  uint64_t seq = 0;
  for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{65537}, size_t{(3 << 20) + 5}}) {
    auto src = fresh(n + 3);
    std::vector<unsigned char> dst(n + 10, kPoison);
    ASSERT_TRUE(move(++seq, src, dst, n).ok()) << n;
    EXPECT_TRUE(lands(src, dst, n)) << n << " B";
    EXPECT_TRUE(a_.events.wait([&](Recorder& r) { return r.tx.count(seq) > 0; })) << "tx done " << n;
    EXPECT_TRUE(a_.events.tx[seq].ok()) << a_.events.tx[seq].to_string();
  }
  EXPECT_EQ(b_.path->stats().chunks_received, 5u);  // the empty one too (a SEND without bytes)
  EXPECT_NE(b_.path->describe().find("RC queue pairs"), std::string::npos) << b_.path->describe();
}

// More release notices than the sender has receives posted: the receiver's NIC retries (RNR)
// until the sender reposts, and every chunk completes.
TEST_F(RdmaPathTest, ReceiverNotReadyIsRetried) {
  Options o;
  o.a.recv = 1;
  o.a.qps = 1;
  o.b.qps = 1;
  connect(o);
  constexpr int kChunks = 200;
  std::vector<std::vector<unsigned char>> src, dst;
  for (int i = 0; i < kChunks; ++i) src.push_back(fresh(64 + 3)), dst.emplace_back(64 + 10, kPoison);
  for (int i = 0; i < kChunks; ++i) {
    auto d = a_.path->post_tx(i, MemRegion{src[i].data() + 3, 64, {}}, true);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    ASSERT_TRUE(b_.path->post_rx(i, *d, MemRegion{dst[i].data() + 5, 64, {}}).ok());
  }
  ASSERT_TRUE(a_.events.wait([](Recorder& r) { return r.tx.size() == kChunks; }));
  ASSERT_TRUE(b_.events.wait([](Recorder& r) { return r.rx.size() == kChunks; }));
  for (int i = 0; i < kChunks; ++i) {
    EXPECT_TRUE(a_.events.tx[i].ok() && b_.events.rx[i].ok()) << i;
    EXPECT_TRUE(lands(src[i], dst[i], 64)) << i;
  }
  EXPECT_FALSE(a_.events.failure.has_value());
}

TEST_F(RdmaPathTest, FloodOfSmallChunks) {
  connect();
  constexpr int kChunks = 5000;
  std::vector<unsigned char> src = fresh(kChunks * 64 + 3), dst(kChunks * 64 + 10, kPoison);
  for (int i = 0; i < kChunks; ++i) {
    size_t n = 1 + static_cast<size_t>(i) % 64;
    auto d = a_.path->post_tx(i, MemRegion{src.data() + 3 + i * 64, n, {}}, true);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    ASSERT_TRUE(b_.path->post_rx(i, *d, MemRegion{dst.data() + 5 + i * 64, n, {}}).ok());
  }
  ASSERT_TRUE(b_.events.wait([](Recorder& r) { return r.rx.size() == kChunks; }));
  ASSERT_TRUE(a_.events.wait([](Recorder& r) { return r.tx.size() == kChunks; }));
  for (int i = 0; i < kChunks; ++i) {
    size_t n = 1 + static_cast<size_t>(i) % 64;
    ASSERT_TRUE(b_.events.rx[i].ok()) << i << ": " << b_.events.rx[i].to_string();
    ASSERT_TRUE(std::equal(src.begin() + 3 + i * 64, src.begin() + 3 + i * 64 + static_cast<ptrdiff_t>(n),
                           dst.begin() + 5 + i * 64))
        << i;
  }
}

TEST_F(RdmaPathTest, BadRkeyIsRefused) {
  WriteTamper t;
  t.rkey_xor = 0x00ff00ff;
  Options o;
  o.a_tamper = &t;
  connect(o);
  auto src = fresh(4096 + 3);
  std::vector<unsigned char> dst(4096 + 10, kPoison);
  EXPECT_FALSE(move(1, src, dst, 4096).ok());
  expect_refused(a_, b_, dst);
}

void write_outside(RdmaPathTest& f, int64_t delta) {
  f.tamper_.addr_delta = delta;
  Options o;
  o.a_tamper = &f.tamper_;
  f.connect(o);
  auto src = fresh(4096 + 3);
  std::vector<unsigned char> dst(3 * 4096 + 10, kPoison);
  // The window is dst[4096 + 5, +4096): the bytes around it are the receiver's too.
  auto d = f.a_.path->post_tx(1, MemRegion{src.data() + 3, 4096, {}}, true);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(f.b_.path->post_rx(1, *d, MemRegion{dst.data() + 4096 + 5, 4096, {}}).ok());
  expect_refused(f.a_, f.b_, dst);
}

TEST_F(RdmaPathTest, AddressPastTheWindowIsRefused) { write_outside(*this, 4096); }
TEST_F(RdmaPathTest, AddressOneBytePastTheWindowIsRefused) { write_outside(*this, 1); }
TEST_F(RdmaPathTest, AddressBeforeTheWindowIsRefused) { write_outside(*this, -1); }

// A peer that sends small chunks past the credits it was granted (and never their headers): the
// receiver holds at most its credits in its slots, then refuses the peer by name; nothing else
// breaks and both paths stop.
TEST_F(RdmaPathTest, FloodOfSmallSendsPastTheCreditsIsRefused) {
  WriteTamper t;
  t.ignore_credits = true;
  Options o;
  o.b.recv = 8;  // 4 credits per queue pair
  o.a.qps = o.b.qps = 1;
  o.a_tamper = &t;
  connect(o);
  auto src = fresh(64);
  for (int i = 0; i < 100; ++i)
    if (!a_.path->post_tx(i, MemRegion{src.data(), src.size(), {}}, true).ok()) break;
  ASSERT_TRUE(b_.events.wait([](Recorder& r) { return r.failure.has_value() && r.stopped; }));
  std::string why = b_.events.failure->to_string();
  EXPECT_NE(why.find("4 credits"), std::string::npos) << why;
  EXPECT_NE(why.find("side a"), std::string::npos) << why;
  EXPECT_EQ(b_.path->stats().chunks_received, 0u);
  ASSERT_TRUE(a_.events.wait([](Recorder& r) { return r.stopped; }));
}

// Within its credits the same flood is backpressure, not a failure: the sender waits for the
// receiver's releases, every chunk lands.
TEST_F(RdmaPathTest, SmallSendsPastTheCreditsWaitForThem) {
  Options o;
  o.b.recv = 8;
  o.a.qps = o.b.qps = 1;
  connect(o);
  constexpr int kChunks = 300;
  std::vector<std::vector<unsigned char>> src, dst;
  std::vector<std::vector<unsigned char>> descs;
  for (int i = 0; i < kChunks; ++i) {
    src.push_back(fresh(100 + 3));
    dst.emplace_back(100 + 10, kPoison);
    auto d = a_.path->post_tx(i, MemRegion{src[i].data() + 3, 100, {}}, true);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    descs.push_back(*d);
  }
  // The headers come late: the sender has sent its 4 credits' worth and waits.
  std::this_thread::sleep_for(200ms);
  EXPECT_LE(b_.path->stats().chunks_received, 4u);
  for (int i = 0; i < kChunks; ++i) ASSERT_TRUE(b_.path->post_rx(i, descs[i], MemRegion{dst[i].data() + 5, 100, {}}).ok());
  ASSERT_TRUE(b_.events.wait([](Recorder& r) { return r.rx.size() == kChunks; }));
  ASSERT_TRUE(a_.events.wait([](Recorder& r) { return r.tx.size() == kChunks; }));
  for (int i = 0; i < kChunks; ++i) {
    ASSERT_TRUE(b_.events.rx[i].ok()) << i << ": " << b_.events.rx[i].to_string();
    ASSERT_TRUE(lands(src[i], dst[i], 100)) << i;
  }
  EXPECT_FALSE(a_.events.failure.has_value() || b_.events.failure.has_value());
}

// Queue-pair numbers that are not the peer's: the reads go nowhere (or to a queue pair that does
// not expect them) and the path fails within the transport's retries, naming the peer.
TEST_F(RdmaPathTest, QueuePairNumbersNotThePeersFailThePath) {
  Options o;
  o.a_hostile = [](ConnInfo* c) {
    for (auto& q : c->qps) q.qpn = (q.qpn + 0x777) & kMaxQpn;
  };
  connect(o);
  auto src = fresh(4096 + 3);
  std::vector<unsigned char> dst(4096 + 10, kPoison);
  EXPECT_FALSE(move(1, src, dst, 4096).ok());
  ASSERT_TRUE(b_.events.wait([](Recorder& r) { return r.failure.has_value(); }, 30s));
  EXPECT_NE(b_.events.failure->to_string().find("side a"), std::string::npos);
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](unsigned char c) { return c == kPoison; }));
}

// A peer that names this side's own queue pairs as its own (here: a mirror that sends back our
// connection info) is refused at set-up, by name, before any queue pair is connected.
TEST_F(RdmaPathTest, PeerNamingOurOwnQueuePairsIsRefused) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  UniqueFd mine(fds[0]), mirror(fds[1]);
  std::thread t([&] {
    std::vector<unsigned char> b(ConnInfo::kFixed);
    if (::recv(mirror.get(), b.data(), b.size(), MSG_WAITALL) != static_cast<ssize_t>(b.size())) return;
    auto total = ConnInfo::total_size(b);
    if (!total.ok()) return;
    b.resize(*total);
    size_t rest = *total - ConnInfo::kFixed;
    if (::recv(mirror.get(), b.data() + ConnInfo::kFixed, rest, MSG_WAITALL) != static_cast<ssize_t>(rest)) return;
    (void)::send(mirror.get(), b.data(), b.size(), MSG_NOSIGNAL);
  });
  auto c = connect_qps(dev_, mine.get(), Depths{}, "mirror peer", Deadline::after(60s));
  t.join();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kProtocol) << c.status().to_string();
  EXPECT_NE(c.status().to_string().find("this side's own"), std::string::npos) << c.status().to_string();
  EXPECT_NE(c.status().to_string().find("mirror peer"), std::string::npos) << c.status().to_string();
}

// The peer goes away with a chunk of ours queued to be read: every pending chunk fails and the path
// stops within a bound; nothing hangs.
TEST_F(RdmaPathTest, PeerThatDiesFailsPendingChunks) {
  connect();
  auto src = fresh(1 << 20);
  std::vector<std::vector<unsigned char>> dst;
  std::vector<std::vector<unsigned char>> descs;
  for (int i = 0; i < 8; ++i) {
    auto d = a_.path->post_tx(i, MemRegion{src.data(), src.size(), {}}, true);
    ASSERT_TRUE(d.ok());
    descs.push_back(*d);
  }
  a_.path->stop();  // the sender dies: its queue pairs go, its socket closes
  ASSERT_TRUE(a_.events.wait([](Recorder& r) { return r.stopped; }));
  a_.path.reset();
  auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < 8; ++i) {
    dst.emplace_back(1 << 20, kPoison);
    Status s = b_.path->post_rx(i, descs[i], MemRegion{dst.back().data(), dst.back().size(), {}});
    if (!s.ok()) break;  // already failed: refused at the gate
  }
  ASSERT_TRUE(b_.events.wait([](Recorder& r) { return r.stopped; }, 120s));
  EXPECT_LT(std::chrono::steady_clock::now() - started, 60s);
  ASSERT_TRUE(b_.events.failure.has_value());
  for (auto& [seq, s] : b_.events.rx) EXPECT_FALSE(s.ok()) << seq;
}

// A region the user deregisters while the peer's WRITE into it is on its way: the window's rkey
// dies with the region, the NIC refuses the write, and not a byte lands.
TEST_F(RdmaPathTest, DeregisteredRegionFailsTheWriteInFlight) {
  connect_holding();
  auto src = fresh(8192);
  std::vector<unsigned char> dst(64 << 10, kPoison);
  auto reg = regions_->add(MemRegion{dst.data(), dst.size(), {}});
  auto d = a_.path->post_tx(1, MemRegion{src.data(), src.size(), {}}, true);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(b_.path->post_rx(1, *d, MemRegion{dst.data() + 100, src.size(), {}}).ok());
  // The receiver has made its window inside the region (and sent its clear-to-send).
  auto until = std::chrono::steady_clock::now() + test::kEventually;
  while (b_.path->describe().find("1 chunks registered alone") == std::string::npos &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(10ms);
  ASSERT_NE(b_.path->describe().find("1 chunks registered alone"), std::string::npos) << b_.path->describe();
  reg.reset();  // deregistered: the window goes with it
  hold_ = false;
  ASSERT_TRUE(a_.events.wait([](Recorder& r) { return r.failure.has_value(); }));
  EXPECT_NE(a_.events.failure->to_string().find("RDMA WRITE"), std::string::npos) << a_.events.failure->to_string();
  ASSERT_TRUE(b_.events.wait([](Recorder& r) { return r.rx.count(1) > 0; }));
  EXPECT_FALSE(b_.events.rx[1].ok());
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](unsigned char c) { return c == kPoison; }));
}

// Registration and deregistration under load: regions come and go while chunks flow from them.
TEST_F(RdmaPathTest, RegistrationChurnUnderLoad) {
  connect();
  for (int i = 0; i < 100; ++i) {
    size_t n = 4096 + static_cast<size_t>(i) * 97;
    auto src = fresh(n + 3);
    auto reg = regions_->add(MemRegion{src.data(), src.size(), {}});
    std::vector<unsigned char> dst(n + 10, kPoison);
    ASSERT_TRUE(move(i + 1, src, dst, n).ok()) << i;
    ASSERT_TRUE(lands(src, dst, n)) << i;
    ASSERT_TRUE(a_.events.wait([&](Recorder& r) { return r.tx.count(i + 1) > 0; }));
    reg.reset();
  }
  EXPECT_NE(a_.path->describe().find("100 by their registered region"), std::string::npos) << a_.path->describe();
  EXPECT_FALSE(a_.events.failure.has_value() || b_.events.failure.has_value());
}

// A destination the NIC cannot register (here simulated device memory; GPU memory without dma-buf
// or peer memory) lands in a host staging buffer and is copied the rest of the way.
TEST_F(RdmaPathTest, DestinationTheNicCannotReachIsStaged) {
  connect();
  constexpr size_t n = (1 << 20) + 7;
  auto src = fresh(n);
  auto dst = Buffer::allocate(MemSpec{MemKind::kSim, 0}, n);
  ASSERT_TRUE(dst.ok()) << dst.status().to_string();
  ASSERT_TRUE(b_.path->accepts(dst->where()));
  auto d = a_.path->post_tx(1, MemRegion{src.data(), n, {}}, true);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(b_.path->post_rx(1, *d, dst->region()).ok());
  ASSERT_TRUE(b_.events.wait([](Recorder& r) { return r.rx.count(1) > 0; }));
  ASSERT_TRUE(b_.events.rx[1].ok()) << b_.events.rx[1].to_string();
  std::vector<unsigned char> back(n);
  ASSERT_TRUE(copy_memory(MemRegion{back.data(), n, {}}, dst->region()).ok());
  EXPECT_EQ(back, src);
  EXPECT_EQ(b_.path->stats().device_copies, 1u);
}

TEST_F(RdmaPathTest, StopIsPromptWithWorkPending) {
  connect();
  auto src = fresh(8 << 20);
  std::vector<unsigned char> dst(8 << 20, kPoison);
  for (int i = 0; i < 16; ++i) {
    auto d = a_.path->post_tx(i, MemRegion{src.data(), src.size(), {}}, true);
    ASSERT_TRUE(d.ok());
    ASSERT_TRUE(b_.path->post_rx(i, *d, MemRegion{dst.data(), dst.size(), {}}).ok());
  }
  auto t0 = std::chrono::steady_clock::now();
  b_.path->stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
  ASSERT_TRUE(b_.events.wait([](Recorder& r) { return r.stopped; }));
  EXPECT_EQ(b_.events.rx.size(), 16u);  // every chunk completed, one way or the other
  EXPECT_FALSE(b_.path->post_rx(99, std::vector<unsigned char>(24), MemRegion{}).ok());
}

// The registered regions through the GTLB (needs no device): a sub-range anywhere in a region is a
// cached translation after the first touch of its page, the same region registered again is the
// same entry (its Mrs serve), and a region's translations go with it.
TEST(RdmaRegions, SubRangesAreLookupsAndTranslationsDieWithTheRegion) {
  auto table = std::make_shared<RegionTable>();
  std::vector<unsigned char> mem = fresh(8 << 20);
  auto reg = table->add(MemRegion{mem.data(), mem.size(), {}});
  EXPECT_EQ(table->add(MemRegion{mem.data(), mem.size(), {}}), reg) << "registered again: not the same entry";
  std::mt19937_64 rng(std::random_device{}());
  constexpr int kLookups = 1000;
  for (int i = 0; i < kLookups; ++i) {
    size_t off = rng() % mem.size();
    size_t len = 1 + rng() % std::min<size_t>(mem.size() - off, 1 << 20);
    ASSERT_EQ(table->find(mem.data() + off, len, {}), reg) << off << " + " << len;
  }
  GtlbCounters c = table->translations();
  // At most one miss per 2 MiB page (3 whole ones) or 64 KiB cell of the two partial ends.
  EXPECT_LE(c.misses, 3u + 2u * Gtlb::kCells) << c.misses;
  EXPECT_GE(c.hits, kLookups - 3u - 2u * Gtlb::kCells) << c.hits;
  EXPECT_EQ(table->find(mem.data() + 1, mem.size(), {}), nullptr) << "past the region's end";
  EXPECT_EQ(table->find(mem.data(), 16, MemSpec{MemKind::kSim, 0}), nullptr) << "another kind";
  reg.reset();
  EXPECT_EQ(table->find(mem.data() + 100, 16, {}), nullptr) << "a translation outlived its region";
  EXPECT_GT(table->translations().invalidations, 0u);
  auto again = table->add(MemRegion{mem.data(), mem.size(), {}});
  EXPECT_EQ(table->find(mem.data() + 100, 16, {}), again);
}

// compatible() gives the same verdict both ways, refuses one host unless a side is forced, and
// takes a malformed offer as a reason. Needs no device.
TEST(RdmaTransport, CompatibleIsSymmetric) {
  auto t = make_rdma_transport();
  auto offer = [](bool forced, bool ethernet) {
    Offer o;
    o.forced = forced;
    o.ethernet = ethernet;
    o.mtu = 3;
    o.device = ethernet ? "rxe0" : "mlx5_0";
    return o.encode();
  };
  PeerPair hosts, one_host;
  one_host.same_host = true;
  std::vector<unsigned char> junk{1, 2, 3};
  struct Case {
    std::vector<unsigned char> a, b;
    PeerPair pair;
    bool ok;
  };
  for (const Case& c : {Case{offer(false, true), offer(false, true), hosts, true},
                        Case{offer(false, true), offer(false, true), one_host, false},
                        Case{offer(true, true), offer(false, true), one_host, true},
                        Case{offer(false, true), offer(false, false), hosts, false},
                        Case{offer(false, true), junk, hosts, false}}) {
    Status ab = t->compatible(c.a, c.b, c.pair), ba = t->compatible(c.b, c.a, c.pair);
    EXPECT_EQ(ab.ok(), c.ok) << ab.to_string();
    EXPECT_EQ(ab.ok(), ba.ok()) << ab.to_string() << " / " << ba.to_string();
  }
}

// p2pmem's refusals name the step and the kernel's errno (no device here publishes p2pmem).
TEST(RdmaP2pmem, RefusalsSayWhy) {
  char dir[] = "/tmp/dmx-p2pmem-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  std::string root = dir;
  auto none = map_p2pmem(root, "0000:01:00.0", 4096);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("publishes no P2PDMA memory"), std::string::npos) << none.status().message();
  std::string p2p = root + "/bus/pci/devices/0000:01:00.0/p2pmem";
  std::error_code ec;
  ASSERT_TRUE(std::filesystem::create_directories(p2p, ec)) << ec.message();
  auto no_alloc = map_p2pmem(root, "0000:01:00.0", 4096);
  ASSERT_FALSE(no_alloc.ok());
  EXPECT_NE(no_alloc.status().message().find("open(" + p2p + "/allocate) failed"), std::string::npos)
      << no_alloc.status().message();
  std::filesystem::remove_all(root, ec);
}

}  // namespace
}  // namespace dmx::rdma

#else

TEST(RdmaPathTest, NotBuilt) { DMX_SKIP(dmx::test::kNotBuilt) << "dmx was built without libibverbs (DMX_ENABLE_RDMA)"; }

#endif
