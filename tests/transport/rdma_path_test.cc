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
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "memory/sim_device.h"
#include "rdma_test_util.h"
#include "transport/rdma/device.h"
#include "transport/rdma/p2pmem.h"
#include "transport/rdma/rdma_path.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/rdma/setup.h"

namespace dmx::rdma {
namespace {

using namespace std::chrono_literals;

struct Options {
  Depths a, b;  // a sends, b receives (each path can do both)
  void (*a_hostile)(ConnInfo*) = nullptr;
  const WriteTamper* a_tamper = nullptr;
};

class RdmaPathTest : public RdmaDeviceTest {
 protected:
  void TearDown() override { stop({&a_, &b_}); }

  void connect(Options o = {}) {
    ConnectedPair p = connect_pair(dev_, o.a, "side b", o.b, "side a", 30s, o.a_hostile);
    ASSERT_TRUE(p.a.ok()) << p.a.status().to_string();
    ASSERT_TRUE(p.b.ok()) << p.b.status().to_string();
    a_.path = make_rdma_path(setup(std::move(*p.a), p.a_fd, "side b", o.a_tamper));
    b_.path = make_rdma_path(setup(std::move(*p.b), p.b_fd, "side a", nullptr));
    a_.path->start(&a_.events, nullptr);
    b_.path->start(&b_.events, nullptr);
  }

  PathSetup setup(std::unique_ptr<Connection> c, int fd, std::string peer, const WriteTamper* tamper) {
    PathSetup s;
    s.device = dev_;
    s.regions = regions_;
    s.gpu = gpu_registration("off");
    s.connection = std::move(c);
    s.socket = UniqueFd(fd);
    s.peer = std::move(peer);
    s.tamper = tamper;
    return s;
  }

  // One chunk a -> b: src[3, 3+n) into dst[5, 5+n). Returns b's rx status.
  Status move(uint64_t seq, const std::vector<unsigned char>& src, std::vector<unsigned char>& dst, size_t n) {
    auto d = a_.path->post_tx(seq, MemRegion{const_cast<unsigned char*>(src.data()) + 3, n, {}}, true);
    if (!d.ok()) return d.status();
    auto len = b_.path->chunk_length(*d);
    if (!len.ok() || *len != n) return Status(Code::kInternal, "chunk_length");
    Status s = b_.path->post_rx(seq, *d, MemRegion{dst.data() + 5, n, {}});
    if (!s.ok()) return s;
    if (!b_.events.wait([&](Recorder& r) { return r.rx.count(seq) > 0; })) return Status(Code::kTimeout, "rx");
    std::lock_guard l(b_.events.mu);
    return b_.events.rx[seq];
  }

  void write_outside(int64_t delta);
  void list_into_device(bool queue_takes_lists);

  std::shared_ptr<RegionTable> regions_ = std::make_shared<RegionTable>();
  Side a_, b_;
};

bool lands(const std::vector<unsigned char>& src, const std::vector<unsigned char>& dst, size_t n) {
  return std::equal(src.begin() + 3, src.begin() + 3 + static_cast<ptrdiff_t>(n), dst.begin() + 5) &&
         dst[4] == kPoison && dst[5 + n] == kPoison;
}

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

// A sender that writes with a key or at an address the clear-to-send did not give is refused by
// the receiver's NIC: the sender's path fails naming the peer and the WRITE, the receiver's chunk
// and path fail (its queue pair is in error), and not a byte lands.
void expect_refused(Side& a, Side& b, const std::vector<unsigned char>& dst) {
  ASSERT_TRUE(a.events.wait([](Recorder& r) { return r.failure.has_value() && r.stopped; }));
  std::string why = a.events.failure->to_string();
  EXPECT_NE(why.find("side b"), std::string::npos) << why;
  EXPECT_NE(why.find("RDMA WRITE"), std::string::npos) << why;
  ASSERT_TRUE(b.events.wait([](Recorder& r) { return r.failure.has_value() && r.stopped; }));
  EXPECT_NE(b.events.failure->to_string().find("side a"), std::string::npos) << b.events.failure->to_string();
  ASSERT_FALSE(b.events.rx.empty());
  EXPECT_FALSE(b.events.rx.begin()->second.ok());
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](unsigned char c) { return c == kPoison; }))
      << "bytes landed from a refused write";
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

void RdmaPathTest::write_outside(int64_t delta) {
  WriteTamper t;
  t.addr_delta = delta;
  Options o;
  o.a_tamper = &t;
  connect(o);
  auto src = fresh(4096 + 3);
  std::vector<unsigned char> dst(3 * 4096 + 10, kPoison);
  // The window is dst[4096 + 5, +4096): the bytes around it are the receiver's too.
  auto d = a_.path->post_tx(1, MemRegion{src.data() + 3, 4096, {}}, true);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(b_.path->post_rx(1, *d, MemRegion{dst.data() + 4096 + 5, 4096, {}}).ok());
  expect_refused(a_, b_, dst);
}

TEST_F(RdmaPathTest, AddressPastTheWindowIsRefused) { write_outside(4096); }
TEST_F(RdmaPathTest, AddressOneBytePastTheWindowIsRefused) { write_outside(1); }
TEST_F(RdmaPathTest, AddressBeforeTheWindowIsRefused) { write_outside(-1); }

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
  std::atomic<bool> hold{true};
  WriteTamper t;
  t.hold = &hold;
  Options o;
  o.a_tamper = &t;
  connect(o);
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
  hold = false;
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

// A list of scattered pieces (a KV cache's blocks) as one chunk: `n` pieces of odd sizes from
// src (a gap of 3 after each) into dst (a gap of 5 before each), or into `dkind` memory.
struct ListCase {
  std::vector<unsigned char> src;
  std::vector<MemRegion> srcs, dsts;
  std::vector<unsigned char> dst;  // host destinations, poisoned between the pieces
  uint64_t total = 0;
};
ListCase make_list(size_t n, size_t base, unsigned char* dst_base = nullptr) {
  ListCase c;
  std::vector<size_t> sizes;
  size_t src_len = 0, dst_len = 0;
  for (size_t i = 0; i < n; ++i) {
    size_t len = i == 7 ? 0 : base + (i * 37) % 613;  // one empty piece among them
    sizes.push_back(len);
    src_len += len + 3;
    dst_len += len + 5;
  }
  c.src = fresh(src_len);
  c.dst.assign(dst_len + 5, kPoison);
  size_t s = 0, d = 5;
  for (size_t len : sizes) {
    c.srcs.push_back(MemRegion{c.src.data() + s, len, {}});
    c.dsts.push_back(MemRegion{(dst_base ? dst_base : c.dst.data()) + d, len, {}});
    s += len + 3;
    d += len + 5;
    c.total += len;
  }
  return c;
}
bool list_landed(const ListCase& c) {
  for (size_t i = 0; i < c.srcs.size(); ++i) {
    const auto* d = static_cast<const unsigned char*>(c.dsts[i].ptr);
    if (!std::equal(d, d + c.dsts[i].size, static_cast<const unsigned char*>(c.srcs[i].ptr)) || d[-1] != kPoison)
      return false;
  }
  return c.dst.back() == kPoison;
}

// Three lists of 300 pieces (over a MiB each: stripes on every queue pair, each stripe gathered by
// several WRITEs of send_sge pieces) and one of 1,024 (the most): byte-exact, poison between, one
// chunk and one event each, scattered by memcpy; unregistered sources registered as one span a list.
TEST_F(RdmaPathTest, ListsLandByteExactAsOneChunk) {
  connect();
  EXPECT_EQ(a_.path->max_list(), kRdmaMaxList);
  std::vector<ListCase> lists;
  for (size_t n : {size_t{300}, size_t{300}, size_t{300}, kRdmaMaxList}) lists.push_back(make_list(n, 3500));
  uint64_t pieces = 0;
  for (size_t i = 0; i < lists.size(); ++i) {
    size_t taken = 0;
    auto d = a_.path->post_tx_list(i, lists[i].srcs, &taken);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    ASSERT_EQ(taken, lists[i].srcs.size());
    auto len = b_.path->chunk_length(*d);
    ASSERT_TRUE(len.ok());
    EXPECT_EQ(*len, lists[i].total);
    ASSERT_TRUE(b_.path->post_rx_list(i, *d, lists[i].dsts).ok());
    pieces += taken;
  }
  ASSERT_TRUE(b_.events.wait([&](Recorder& r) { return r.rx.size() == lists.size(); }));
  ASSERT_TRUE(a_.events.wait([&](Recorder& r) { return r.tx.size() == lists.size(); }));
  for (size_t i = 0; i < lists.size(); ++i) {
    EXPECT_TRUE(b_.events.rx[i].ok() && a_.events.tx[i].ok()) << b_.events.rx[i].to_string();
    EXPECT_TRUE(list_landed(lists[i])) << "list " << i;
  }
  // Unregistered sources: one registration of each list's span, not one a piece.
  EXPECT_NE(a_.path->describe().find("4 chunks registered alone"), std::string::npos) << a_.path->describe();
  PathStats st = b_.path->stats();
  EXPECT_EQ(st.chunks_received, lists.size());
  EXPECT_EQ(st.host_copies, pieces - lists.size());  // one memcpy a piece but the empty one, out of staging
  EXPECT_FALSE(a_.events.failure.has_value() || b_.events.failure.has_value());
}

// A list whose sources' span has a hole (an unmapped page between two pieces) cannot be
// registered as one: each piece is registered alone, and the list lands as well.
TEST_F(RdmaPathTest, ListSourcesAroundAHoleAreRegisteredPieceByPiece) {
  connect();
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* m = ::mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* base = static_cast<unsigned char*>(m);
  ASSERT_EQ(::munmap(base + page, page), 0);
  auto bytes = fresh(2 * page);
  std::memcpy(base, bytes.data(), page);
  std::memcpy(base + 2 * page, bytes.data() + page, page);
  std::vector<unsigned char> dst(2 * page + 10, kPoison);
  std::vector<MemRegion> srcs{{base + 1, page - 1, {}}, {base + 2 * page, page - 3, {}}};
  std::vector<MemRegion> dsts{{dst.data() + 5, page - 1, {}}, {dst.data() + 5 + page, page - 3, {}}};
  size_t taken = 0;
  auto d = a_.path->post_tx_list(1, srcs, &taken);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(taken, 2u);
  ASSERT_TRUE(b_.path->post_rx_list(1, *d, dsts).ok());
  ASSERT_TRUE(b_.events.wait([](Recorder& r) { return r.rx.count(1) > 0; }));
  ASSERT_TRUE(a_.events.wait([](Recorder& r) { return r.tx.count(1) > 0; }));
  EXPECT_TRUE(b_.events.rx[1].ok()) << b_.events.rx[1].to_string();
  EXPECT_TRUE(std::equal(base + 1, base + page, dst.begin() + 5));
  EXPECT_TRUE(std::equal(base + 2 * page, base + 3 * page - 3, dst.begin() + 5 + static_cast<ptrdiff_t>(page)));
  EXPECT_EQ(dst[4], kPoison);
  EXPECT_NE(a_.path->describe().find("2 chunks registered alone"), std::string::npos) << a_.path->describe();
  ::munmap(base, page);
  ::munmap(base + 2 * page, page);
}

// A path takes a prefix of a list where it must, and the rest goes in the next list chunk: at the
// chunk maximum (1 MiB here), at a change of memory kind, and at a piece it cannot register (an
// unmapped page: the pieces before it go, then that piece alone is refused with the reason).
TEST_F(RdmaPathTest, ListsAreCutWhereThePathMust) {
  Options o;
  o.a.max_chunk = o.b.max_chunk = 1 << 20;
  connect(o);
  uint64_t seq = 0;
  auto send_all = [&](std::vector<MemRegion> srcs, std::vector<MemRegion> dsts, std::vector<size_t>* cuts) {
    size_t at = 0;
    while (at < srcs.size()) {
      size_t taken = 0;
      auto d = a_.path->post_tx_list(++seq, std::span(srcs).subspan(at), &taken);
      ASSERT_TRUE(d.ok()) << d.status().to_string();
      ASSERT_GE(taken, 1u);
      ASSERT_TRUE(b_.path->post_rx_list(seq, *d, std::span(dsts).subspan(at, taken)).ok());
      cuts->push_back(taken);
      at += taken;
    }
    ASSERT_TRUE(b_.events.wait([&](Recorder& r) { return r.rx.size() == seq; }));
  };
  ListCase c = make_list(400, 3500);  // about 1.5 MiB
  std::vector<size_t> cuts;
  send_all(c.srcs, c.dsts, &cuts);
  ASSERT_GE(cuts.size(), 2u) << "a list over the chunk maximum went whole";
  for (size_t i = 0, at = 0; i < cuts.size(); at += cuts[i++]) {
    uint64_t bytes = 0;
    for (size_t k = at; k < at + cuts[i]; ++k) bytes += c.srcs[k].size;
    EXPECT_LE(bytes, uint64_t{1} << 20) << "cut " << i;
  }
  EXPECT_TRUE(list_landed(c));

  ListCase k = make_list(10, 5000);
  for (size_t i = 4; i < 10; ++i) k.srcs[i].where = MemSpec{MemKind::kPinned, 0};  // host memory by another name
  cuts.clear();
  send_all(k.srcs, k.dsts, &cuts);
  EXPECT_EQ(cuts, (std::vector<size_t>{4, 6}));
  EXPECT_TRUE(list_landed(k));
  for (auto& [i, st] : b_.events.rx) EXPECT_TRUE(st.ok()) << i << ": " << st.to_string();

  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* m = ::mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* base = static_cast<unsigned char*>(m);
  std::memset(base, 0x5C, page);
  ASSERT_EQ(::munmap(base + page, page), 0);
  std::vector<MemRegion> srcs{{base, 100, {}}, {base + page, 100, {}}, {base + 2 * page, 100, {}}};
  size_t taken = 0;
  auto d = a_.path->post_tx_list(++seq, srcs, &taken);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(taken, 1u) << "the piece in the hole must end the list";
  auto len = b_.path->chunk_length(*d);
  ASSERT_TRUE(len.ok());
  EXPECT_EQ(*len, 100u);
  std::vector<unsigned char> dst(100, kPoison);
  ASSERT_TRUE(b_.path->post_rx_list(seq, *d, std::vector<MemRegion>{{dst.data(), 100, {}}}).ok());
  auto bad = a_.path->post_tx_list(seq + 1, std::span(srcs).subspan(1), &taken);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().to_string().find("side b"), std::string::npos) << bad.status().to_string();
  ASSERT_TRUE(b_.events.wait([&](Recorder& r) { return r.rx.count(seq) > 0; }));
  EXPECT_TRUE(b_.events.rx[seq].ok()) << b_.events.rx[seq].to_string();
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](unsigned char x) { return x == 0x5C; }));
  EXPECT_FALSE(a_.events.failure.has_value() || b_.events.failure.has_value());
  ::munmap(base, page);
  ::munmap(base + 2 * page, page);
}

// A list into memory the NIC cannot register (simulated device memory) lands in the staging window
// and goes out as one list on the device's copy queue, or — a queue that takes no lists — one copy
// a piece on it, waited for once; a list the receiver drops (all destinations null) lets the
// sender go.
void RdmaPathTest::list_into_device(bool queue_takes_lists) {
  connect();
  struct Refuse {  // process-wide: back to the default however the test ends
    explicit Refuse(bool on) { sim_refuse_lists(on); }
    ~Refuse() { sim_refuse_lists(false); }
  } refuse(!queue_takes_lists);
  auto dev = Buffer::allocate(MemSpec{MemKind::kSim, 0}, 2 << 20);
  ASSERT_TRUE(dev.ok()) << dev.status().to_string();
  std::vector<unsigned char> poison(dev->size(), kPoison);
  ASSERT_TRUE(copy_memory(dev->region(), MemRegion{poison.data(), poison.size(), {}}).ok());
  ListCase c = make_list(100, 9000, static_cast<unsigned char*>(dev->data()));
  for (auto& d : c.dsts) d.where = dev->where();
  size_t taken = 0;
  auto d = a_.path->post_tx_list(1, c.srcs, &taken);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  ASSERT_TRUE(b_.path->post_rx_list(1, *d, c.dsts).ok());
  auto d2 = a_.path->post_tx_list(2, c.srcs, &taken);
  ASSERT_TRUE(d2.ok());
  std::vector<MemRegion> dropped(c.dsts.size());
  for (size_t i = 0; i < dropped.size(); ++i) dropped[i].size = c.dsts[i].size;
  ASSERT_TRUE(b_.path->post_rx_list(2, *d2, dropped).ok());
  ASSERT_TRUE(b_.events.wait([](Recorder& r) { return r.rx.size() == 2; }));
  ASSERT_TRUE(a_.events.wait([](Recorder& r) { return r.tx.size() == 2; }));
  EXPECT_TRUE(b_.events.rx[1].ok() && b_.events.rx[2].ok() && a_.events.tx[2].ok()) << b_.events.rx[1].to_string();
  std::vector<unsigned char> back(dev->size());
  ASSERT_TRUE(copy_memory(MemRegion{back.data(), back.size(), {}}, dev->region()).ok());
  for (size_t i = 0; i < c.dsts.size(); ++i) {
    size_t at =
        static_cast<size_t>(static_cast<unsigned char*>(c.dsts[i].ptr) - static_cast<unsigned char*>(dev->data()));
    ASSERT_TRUE(std::equal(back.begin() + at, back.begin() + at + c.dsts[i].size,
                           static_cast<const unsigned char*>(c.srcs[i].ptr)))
        << "piece " << i;
    ASSERT_EQ(back[at - 1], kPoison) << "before piece " << i;  // untouched between the pieces
  }
  EXPECT_EQ(b_.path->stats().device_copies, 99u);  // one a piece but the empty one
}

TEST_F(RdmaPathTest, ListsIntoDeviceMemoryAndDroppedLists) {
  list_into_device(true);
}
TEST_F(RdmaPathTest, ListsIntoDeviceMemoryByACopyEachWhenTheQueueTakesNoLists) {
  list_into_device(false);
}

// A peer decides how many lists we stage at once: the receiver holds at most 64 MiB of staging
// (kMaxStaged) and answers the rest when room comes back. Ten lists of 8 MiB, the sender's
// WRITEs held: eight clear-to-sends (eight windows), then, released, every list lands.
TEST_F(RdmaPathTest, StagingForListsInFlightIsBounded) {
  std::atomic<bool> hold{true};
  WriteTamper t;
  t.hold = &hold;
  Options o;
  o.a_tamper = &t;
  connect(o);
  constexpr size_t kLists = 10, kPiece = 4 << 20;
  std::vector<std::vector<unsigned char>> src, dst;
  for (size_t i = 0; i < kLists; ++i) src.push_back(fresh(2 * kPiece)), dst.emplace_back(2 * kPiece + 64, kPoison);
  for (size_t i = 0; i < kLists; ++i) {
    std::vector<MemRegion> srcs{{src[i].data(), kPiece, {}}, {src[i].data() + kPiece, kPiece, {}}};
    std::vector<MemRegion> dsts{{dst[i].data() + 64, kPiece, {}}, {dst[i].data() + 64 + kPiece, kPiece, {}}};
    size_t taken = 0;
    auto d = a_.path->post_tx_list(i, srcs, &taken);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    ASSERT_TRUE(b_.path->post_rx_list(i, *d, dsts).ok());
  }
  auto windows = [](size_t n) { return std::to_string(n) + " chunks registered alone"; };
  auto until = std::chrono::steady_clock::now() + test::kEventually;
  while (b_.path->describe().find(windows(8)) == std::string::npos && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(200ms);  // time for more, were more let through
  EXPECT_NE(b_.path->describe().find(windows(8)), std::string::npos) << b_.path->describe();
  hold = false;
  ASSERT_TRUE(b_.events.wait([&](Recorder& r) { return r.rx.size() == kLists; }, 120s));
  for (size_t i = 0; i < kLists; ++i) {
    EXPECT_TRUE(b_.events.rx[i].ok()) << b_.events.rx[i].to_string();
    EXPECT_TRUE(std::equal(src[i].begin(), src[i].end(), dst[i].begin() + 64)) << "list " << i;
    EXPECT_EQ(dst[i][63], kPoison);
  }
  EXPECT_NE(b_.path->describe().find(windows(kLists)), std::string::npos) << b_.path->describe();
}

// What a list's descriptor claims is checked against the receiver's own table: a length that is
// not the pieces' sum, a list "by SEND", too many pieces — each refused naming the peer, and the
// path goes on.
TEST_F(RdmaPathTest, ListDescriptorsThatDisagreeAreRefused) {
  connect();
  std::vector<unsigned char> dst(8192, kPoison);
  std::vector<MemRegion> dsts{{dst.data(), 1000, {}}, {dst.data() + 2000, 3000, {}}};
  auto refused = [&](ChunkDescriptor d, std::span<const MemRegion> list, const char* what) {
    Status s = b_.path->post_rx_list(1, d.encode(), list);
    EXPECT_EQ(s.code(), Code::kProtocol) << what << ": " << s.to_string();
    EXPECT_NE(s.to_string().find("side a"), std::string::npos) << s.to_string();
  };
  refused(ChunkDescriptor{3999, 5, false}, dsts, "one byte short");
  refused(ChunkDescriptor{4001, 5, false}, dsts, "one byte over");
  refused(ChunkDescriptor{1000, 5, false}, dsts, "less than the pieces");
  std::vector<MemRegion> small{{dst.data(), 1000, {}}, {dst.data() + 2000, 1000, {}}};
  refused(ChunkDescriptor{2000, 5, true}, small, "by SEND");  // a small chunk's length, and the pieces' sum
  std::vector<MemRegion> many(kRdmaMaxList + 1, MemRegion{dst.data(), 1, {}});
  refused(ChunkDescriptor{kRdmaMaxList + 1, 5, false}, many, "too many pieces");
  refused(ChunkDescriptor{0, 5, false}, {}, "no pieces");
  EXPECT_FALSE(b_.events.failure.has_value());
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](unsigned char c) { return c == kPoison; }));
}

// A sender that writes a list outside the window it was given is refused by the NIC, and not a
// byte of the list reaches its destinations: they are scattered only once every stripe landed.
TEST_F(RdmaPathTest, ListWrittenOutsideItsWindowLandsNothing) {
  WriteTamper t;
  t.addr_delta = 1;
  Options o;
  o.a_tamper = &t;
  connect(o);
  ListCase c = make_list(200, 2000);
  size_t taken = 0;
  auto d = a_.path->post_tx_list(1, c.srcs, &taken);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(b_.path->post_rx_list(1, *d, c.dsts).ok());
  expect_refused(a_, b_, c.dst);
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
