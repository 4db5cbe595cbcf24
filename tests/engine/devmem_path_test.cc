// Tests of the devmem payload path. DevmemPathDouble.* run it over the socket-pair double
// (tests/devmem/socket_double.h): a real connected TCP socket pair on loopback, the sender's double
// reading the TX-bound ring and writing the bytes, the receiver's double scattering them into the
// RX-bound pool as fragments with tokens. No devmem NIC is involved. DevmemPathRealHost.* ask this
// machine.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "core/config.h"
#include "devmem/socket_double.h"
#include "transport/devmem/devmem_path.h"
#include "transport/devmem/tx_regions.h"
#include "engine/devmem_path_util.h"
#include "engine/test_util.h"

namespace dmx {
namespace {

using devmem::testing::SimNic;
using devmem::testing::SimNicOptions;
using test::filled;
using test::poisoned;
using test::random_bytes;
using test::read_back;
using namespace devmem_path_test;

constexpr auto kWait = std::chrono::seconds(60);
const MemSpec kSimMem{MemKind::kSim, 0};
const MemSpec kHostMem{MemKind::kHost, 0};

std::unique_ptr<PayloadPath> make_path(UniqueFd fd, SimNic& nic, const std::string& peer) {
  auto p = make_devmem_path(std::move(fd), config(), peer, nic.seams());
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return p.ok() ? std::move(*p) : nullptr;
}

// Two paths over one TCP pair, each over its own SimNic ("host").
struct PathPair {
  SimNic nic_a{SimNicOptions{"simdev0", 11}};
  SimNic nic_b;
  Recorder ev_a, ev_b;
  std::unique_ptr<PayloadPath> a, b;
  explicit PathPair(SimNicOptions b_options = SimNicOptions{"simdev0", 22, 512, 9000, 0.05}) : nic_b(b_options) {
    auto [x, y] = tcp_pair();
    a = make_path(std::move(x), nic_a, "host-b");
    b = make_path(std::move(y), nic_b, "host-a");
    a->start(&ev_a, nullptr);
    b->start(&ev_b, nullptr);
  }
  ~PathPair() {
    if (a) a->stop();
    if (b) b->stop();
  }
  void expect_clean() {
    a->stop();
    b->stop();
    EXPECT_TRUE(ev_a.wait_stopped());
    EXPECT_TRUE(ev_b.wait_stopped());
    for (SimNic* n : {&nic_a, &nic_b}) {
      EXPECT_EQ(n->outstanding_tokens(), 0u) << "tokens leaked";
      EXPECT_EQ(n->unknown_returns(), 0u) << "tokens returned twice or made up";
      EXPECT_EQ(n->reused_before_completion(), 0u) << "TX ring reused before its zerocopy completion";
    }
    EXPECT_TRUE(ev_a.failed().empty());
    EXPECT_TRUE(ev_b.failed().empty());
    EXPECT_TRUE(ev_a.exactly_once());
    EXPECT_TRUE(ev_b.exactly_once());
  }
};

TEST(DevmemPathDouble, DeliversExactBytesOfManySizesWithManyChunksInFlight) {
  PathPair pp;
  // 64 MiB + 3 is cut to max_chunk pieces, as the endpoint does.
  std::vector<size_t> sizes = {1, 4097, (1 << 20) + 3, 0, 4096, 12345};
  for (size_t left = (64u << 20) + 3; left > 0;) {
    size_t n = std::min<size_t>(left, pp.a->max_chunk());
    sizes.push_back(n);
    left -= n;
  }
  std::vector<test::Filled> src;
  std::vector<Buffer> dst;
  for (size_t i = 0; i < sizes.size(); ++i) {
    src.push_back(filled(kSimMem, sizes[i]));
    dst.push_back(poisoned(i % 2 ? kSimMem : kHostMem, sizes[i]));
  }
  // Everything in flight at once, receives posted first for half of them and after for the rest.
  for (size_t i = 0; i < sizes.size() / 2; ++i) ASSERT_TRUE(pp.b->post_rx(i, desc(sizes[i]), dst[i].region()).ok());
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(pp.a->carries(src[i].buf.where()));
    auto d = pp.a->post_tx(i, src[i].buf.region(), true);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    ASSERT_EQ(*pp.b->chunk_length(*d), sizes[i]);
  }
  for (size_t i = sizes.size() / 2; i < sizes.size(); ++i)
    ASSERT_TRUE(pp.b->post_rx(i, desc(sizes[i]), dst[i].region()).ok());
  for (size_t i = 0; i < sizes.size(); ++i) {
    Status t = pp.ev_a.tx(i), r = pp.ev_b.rx(i);
    ASSERT_TRUE(t.ok()) << t.to_string();
    ASSERT_TRUE(r.ok()) << r.to_string();
    ASSERT_TRUE(read_back(dst[i].region()) == src[i].data) << "chunk " << i << " of " << sizes[i] << " bytes differs";
  }
  DevmemPathCounters c;
  ASSERT_TRUE(devmem_path_counters(*pp.b, &c));
  EXPECT_GT(c.fragments, 1000u);
  EXPECT_GT(c.linear_chunks, 0u);
  EXPECT_EQ(c.tokens_returned, c.fragments);
  EXPECT_EQ(c.tokens_outstanding, 0u);
  PathStats sb = pp.b->stats(), sa = pp.a->stats();
  size_t total = 0;
  for (size_t s : sizes) total += s;
  EXPECT_EQ(sb.bytes_received, total);
  EXPECT_EQ(sb.chunks_received, sizes.size());
  EXPECT_EQ(sa.bytes_sent, total);
  EXPECT_GT(sa.device_copies, 0u);  // staging copies into the TX ring
  EXPECT_GT(sb.host_copies, 0u);    // linear chunks
  EXPECT_NE(pp.a->describe().find("devmem simdev0"), std::string::npos) << pp.a->describe();
  EXPECT_FALSE(pp.a->receiver_releases());
  EXPECT_FALSE(pp.a->carries(kHostMem));
  pp.expect_clean();
}

TEST(DevmemPathDouble, BothDirectionsAtOnceDoNotDeadlock) {
  PathPair pp;
  const size_t n = 16u << 20;
  std::vector<test::Filled> sa, sb;
  std::vector<Buffer> da, db;
  for (int i = 0; i < 3; ++i) {
    sa.push_back(filled(kSimMem, n));
    sb.push_back(filled(kSimMem, n));
    da.push_back(poisoned(kHostMem, n));
    db.push_back(poisoned(kHostMem, n));
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(pp.a->post_tx(i, sa[i].buf.region(), true).ok());
    ASSERT_TRUE(pp.b->post_tx(i, sb[i].buf.region(), true).ok());
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(pp.a->post_rx(i, desc(n), da[i].region()).ok());
    ASSERT_TRUE(pp.b->post_rx(i, desc(n), db[i].region()).ok());
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(pp.ev_a.rx(i).ok());
    ASSERT_TRUE(pp.ev_b.rx(i).ok());
    EXPECT_TRUE(read_back(db[i].region()) == sa[i].data);
    EXPECT_TRUE(read_back(da[i].region()) == sb[i].data);
  }
  pp.expect_clean();
}

TEST(DevmemPathDouble, DropThenIntactChunk) {
  PathPair pp;
  auto s0 = filled(kSimMem, (3u << 20) + 7), s1 = filled(kSimMem, 70001);
  Buffer d1 = poisoned(kHostMem, s1.data.size());
  ASSERT_TRUE(pp.a->post_tx(0, s0.buf.region(), true).ok());
  ASSERT_TRUE(pp.a->post_tx(1, s1.buf.region(), true).ok());
  ASSERT_TRUE(pp.b->post_rx(0, desc(s0.data.size()), MemRegion{nullptr, s0.data.size(), kHostMem}).ok());
  ASSERT_TRUE(pp.b->post_rx(1, desc(s1.data.size()), d1.region()).ok());
  ASSERT_TRUE(pp.ev_b.rx(0).ok());
  ASSERT_TRUE(pp.ev_b.rx(1).ok());
  EXPECT_TRUE(read_back(d1.region()) == s1.data);
  pp.expect_clean();
}

// A list: `sizes` pieces at scattered offsets of one source, for scattered places (in reverse
// order) of two destinations; what the destinations must hold afterwards.
struct ListCase {
  test::Filled src;
  Buffer d0, d1;
  std::vector<MemRegion> srcs, dsts;
  std::vector<unsigned char> want0, want1;
  uint64_t total = 0;
  ListCase(const std::vector<size_t>& sizes, MemSpec d0_mem, MemSpec d1_mem) {
    uint64_t span = 0;
    for (size_t n : sizes) span += n + 13;
    src = filled(kSimMem, span);
    d0 = poisoned(d0_mem, span);
    d1 = poisoned(d1_mem, span);
    want0.assign(span, 0xA5);
    want1.assign(span, 0xA5);
    uint64_t from = 5, to = span;
    for (size_t k = 0; k < sizes.size(); ++k) {
      to -= sizes[k] + 13;
      srcs.push_back(src.buf.region().sub(from, sizes[k]));
      dsts.push_back((k % 2 ? d1 : d0).region().sub(to, sizes[k]));
      std::copy_n(src.data.begin() + static_cast<ptrdiff_t>(from), sizes[k],
                  (k % 2 ? want1 : want0).begin() + static_cast<ptrdiff_t>(to));
      from += sizes[k] + 13;
      total += sizes[k];
    }
  }
  void expect_landed() {
    EXPECT_TRUE(read_back(d0.region()) == want0) << "a list landed the wrong bytes in its first destination";
    EXPECT_TRUE(read_back(d1.region()) == want1) << "a list landed the wrong bytes in its second destination";
  }
};

TEST(DevmemPathDouble, ListOfScatteredPiecesIsOneChunk) {
  PathPair pp;
  ListCase lc({1, 4097, 777, 1u << 20, 3, 65539, 12345, 4096}, kSimMem, kHostMem);
  size_t taken = 0;
  auto d = pp.a->post_tx_list(0, lc.srcs, &taken);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(taken, lc.srcs.size());
  EXPECT_EQ(*pp.b->chunk_length(*d), lc.total);
  // A plain chunk behind it: the byte order on the socket is the posts' order.
  auto s1 = filled(kSimMem, 70001);
  Buffer d1 = poisoned(kHostMem, s1.data.size());
  ASSERT_TRUE(pp.a->post_tx(1, s1.buf.region(), true).ok());
  ASSERT_TRUE(pp.b->post_rx_list(0, *d, lc.dsts).ok());
  ASSERT_TRUE(pp.b->post_rx(1, desc(s1.data.size()), d1.region()).ok());
  for (uint64_t seq : {0, 1}) {
    Status t = pp.ev_a.tx(seq), r = pp.ev_b.rx(seq);
    ASSERT_TRUE(t.ok()) << t.to_string();
    ASSERT_TRUE(r.ok()) << r.to_string();
  }
  lc.expect_landed();
  EXPECT_TRUE(read_back(d1.region()) == s1.data);
  EXPECT_EQ(pp.a->stats().chunks_sent, 2u) << "the list went as one send";
  EXPECT_EQ(pp.b->stats().chunks_received, 2u);
  pp.expect_clean();
}

// A list takes at most kDevmemMaxList pieces, kDevmemMaxChunk bytes and one kind of memory; what
// it leaves goes in the next list. A list whose destinations are all null is consumed and dropped.
TEST(DevmemPathDouble, ListTakesAPrefixWithinItsLimits) {
  PathPair pp;
  auto src = filled(kSimMem, 2 * kDevmemMaxChunk);
  auto host = filled(kHostMem, 64);
  std::vector<MemRegion> many(kDevmemMaxList + 6, src.buf.region().sub(0, 1));
  std::vector<MemRegion> big(20, src.buf.region().sub(0, 1u << 20));
  std::vector<MemRegion> mixed = {src.buf.region().sub(0, 10), src.buf.region().sub(10, 10), host.buf.region()};
  uint64_t seq = 0;
  for (auto [list, want] : {std::pair{&many, kDevmemMaxList}, std::pair{&big, size_t{16}}, std::pair{&mixed, size_t{2}}}) {
    size_t taken = 0;
    auto d = pp.a->post_tx_list(seq, *list, &taken);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_EQ(taken, want);
    std::vector<MemRegion> dsts;
    for (size_t k = 0; k < taken; ++k) dsts.push_back(MemRegion{nullptr, (*list)[k].size, kHostMem});
    ASSERT_TRUE(pp.b->post_rx_list(seq, *d, dsts).ok());
    ASSERT_TRUE(pp.ev_a.tx(seq).ok());
    ASSERT_TRUE(pp.ev_b.rx(seq).ok());
    ++seq;
  }
  size_t taken = 0;
  EXPECT_EQ(pp.a->post_tx_list(seq, std::vector<MemRegion>{host.buf.region()}, &taken).status().code(),
            Code::kUnavailable) << "host sources stay inline on the streams";
  ListCase lc({100, 200, 300}, kSimMem, kSimMem);  // after three lists, one that lands
  auto d = pp.a->post_tx_list(seq, lc.srcs, &taken);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  ASSERT_TRUE(pp.b->post_rx_list(seq, *d, lc.dsts).ok());
  ASSERT_TRUE(pp.ev_b.rx(seq).ok());
  lc.expect_landed();
  pp.expect_clean();
}

// Destinations the gatherer cannot write (as a GPU pool's other memory): the whole list lands in
// the landing zone and each piece is copied on.
TEST(DevmemPathDouble, ListLandsWhereTheGathererCannotWrite) {
  SimNicOptions o{"simdev0", 22, 512, 9000, 0.05};
  o.gather_host_only = true;
  PathPair pp(o);
  ListCase lc({4097, 1, 65536, 999, 3}, kSimMem, kHostMem);  // sim: landed; host: the gatherer could
  size_t taken = 0;
  auto d = pp.a->post_tx_list(0, lc.srcs, &taken);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  ASSERT_TRUE(pp.b->post_rx_list(0, *d, lc.dsts).ok());
  ASSERT_TRUE(pp.ev_a.tx(0).ok());
  Status r = pp.ev_b.rx(0);
  ASSERT_TRUE(r.ok()) << r.to_string();
  lc.expect_landed();
  DevmemPathCounters c;
  ASSERT_TRUE(devmem_path_counters(*pp.b, &c));
  EXPECT_EQ(c.landed_chunks, 1u);
  EXPECT_EQ(c.landed_bytes, lc.total);
  pp.expect_clean();
}

// The descriptor is the peer's word: a length that is not the table's sum is a protocol error,
// and so are more pieces than a list takes. Nothing is posted, and the path goes on.
TEST(DevmemPathDouble, ListDescriptorThatDisagreesIsRefused) {
  PathPair pp;
  Buffer d = poisoned(kHostMem, 64);
  std::vector<MemRegion> dsts = {d.region().sub(0, 10), d.region().sub(20, 30)};
  Status s = pp.b->post_rx_list(0, desc(41), dsts);
  EXPECT_EQ(s.code(), Code::kProtocol) << s.to_string();
  EXPECT_NE(s.message().find("a list descriptor of 41 bytes for pieces of 40 bytes"), std::string::npos) << s.to_string();
  EXPECT_EQ(pp.b->post_rx_list(0, desc(kDevmemMaxChunk + 1), dsts).code(), Code::kProtocol);
  std::vector<MemRegion> many(kDevmemMaxList + 1, d.region().sub(0, 1));
  EXPECT_EQ(pp.b->post_rx_list(0, desc(many.size()), many).code(), Code::kProtocol);
  std::vector<MemRegion> half = {d.region().sub(0, 10), MemRegion{nullptr, 30, kHostMem}};
  EXPECT_EQ(pp.b->post_rx_list(0, desc(40), half).code(), Code::kInvalidArgument);
  ListCase lc({10, 30}, kHostMem, kSimMem);
  size_t taken = 0;
  auto good = pp.a->post_tx_list(0, lc.srcs, &taken);
  ASSERT_TRUE(good.ok());
  ASSERT_TRUE(pp.b->post_rx_list(0, *good, lc.dsts).ok());
  ASSERT_TRUE(pp.ev_b.rx(0).ok());
  lc.expect_landed();
  pp.expect_clean();
}

// A receiving path whose peer is a raw socket the test writes into (for hostile or broken peers).
struct RawPeer {
  SimNic nic{SimNicOptions{"simdev0", 33, 512, 9000, 0.05}};
  Recorder ev;
  UniqueFd raw;
  std::unique_ptr<PayloadPath> path;
  RawPeer() {
    auto [x, y] = tcp_pair();
    raw = std::move(x);
    path = make_path(std::move(y), nic, "evil-peer:7");
    path->start(&ev, nullptr);
  }
  ~RawPeer() {
    if (path) path->stop();
  }
  void write(const std::vector<unsigned char>& b) {
    size_t at = 0;
    while (at < b.size()) {
      ssize_t n = ::send(raw.get(), b.data() + at, b.size() - at, MSG_NOSIGNAL);
      if (n <= 0) return;  // the path failed and closed the connection (what the fault tests expect)
      at += static_cast<size_t>(n);
    }
  }
  // The path failed once with `code` and a message containing `text`, naming the peer; the
  // pending chunk completed with that error; no token leaked beyond `held` (the kernel frees
  // those at close); stop then reports stopped once.
  void expect_failed(uint64_t seq, Code code, const std::string& text, size_t held = 0) {
    ASSERT_TRUE(ev.wait_failed());
    Status f = ev.failed().front();
    EXPECT_EQ(f.code(), code) << f.to_string();
    EXPECT_NE(f.message().find(text), std::string::npos) << f.to_string();
    EXPECT_EQ(f.peer(), "evil-peer:7") << f.to_string();
    Status r = ev.rx(seq);
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.code(), code) << r.to_string();
    path->stop();
    EXPECT_TRUE(ev.wait_stopped());
    EXPECT_EQ(ev.failed().size(), 1u);
    EXPECT_EQ(ev.stopped(), 1);
    EXPECT_EQ(nic.outstanding_tokens(), held);
    EXPECT_EQ(nic.unknown_returns(), 0u);
    Buffer d = poisoned(kHostMem, 10);
    EXPECT_FALSE(path->post_rx(seq + 1, desc(10), d.region()).ok()) << "posts after a failure are refused";
  }
};

TEST(DevmemPathDouble, UnknownDmabufIdFailsThePath) {
  RawPeer p;
  Buffer d = poisoned(kHostMem, 1 << 20);
  ASSERT_TRUE(p.path->post_rx(0, desc(1 << 20), d.region()).ok());
  p.nic.corrupt_next_id(99);
  p.write(random_bytes(1 << 20));
  p.expect_failed(0, Code::kProtocol, "unknown dmabuf id 99");
}

TEST(DevmemPathDouble, FragmentOutsideTheBoundBufferFailsThePath) {
  RawPeer p;
  Buffer d = poisoned(kHostMem, 1 << 20);
  ASSERT_TRUE(p.path->post_rx(0, desc(1 << 20), d.region()).ok());
  p.nic.corrupt_next_offset();
  p.write(random_bytes(1 << 20));
  p.expect_failed(0, Code::kOutOfRange, "outside the bound buffer");
}

TEST(DevmemPathDouble, TokenOverflowFailsThePath) {
  RawPeer p;
  Buffer d = poisoned(kHostMem, 1 << 20);
  ASSERT_TRUE(p.path->post_rx(0, desc(1 << 20), d.region()).ok());
  p.nic.corrupt_next_token();
  p.write(random_bytes(1 << 20));
  // The real token behind the corrupted one cannot be named back; the kernel frees it at close.
  p.expect_failed(0, Code::kProtocol, "beyond the kernel's 31-bit range", 1);
}

TEST(DevmemPathDouble, MoreBytesThanAnnouncedFailsThePath) {
  RawPeer p;
  auto data = random_bytes(100000);
  Buffer d = poisoned(kHostMem, 90000);
  ASSERT_TRUE(p.path->post_rx(0, desc(90000), d.region()).ok());
  p.write(data);  // 10000 bytes more than announced
  ::shutdown(p.raw.get(), SHUT_WR);
  ASSERT_TRUE(p.ev.rx(0).ok());
  EXPECT_TRUE(read_back(d.region()) == std::vector<unsigned char>(data.begin(), data.begin() + 90000));
  ASSERT_TRUE(p.ev.wait_failed());
  Status f = p.ev.failed().front();
  EXPECT_EQ(f.code(), Code::kProtocol) << f.to_string();
  EXPECT_NE(f.message().find("more than it announced"), std::string::npos) << f.to_string();
  EXPECT_EQ(f.peer(), "evil-peer:7");
  p.path->stop();
  EXPECT_TRUE(p.ev.wait_stopped());
  EXPECT_EQ(p.nic.outstanding_tokens(), 0u);
  EXPECT_EQ(p.nic.unknown_returns(), 0u);
}

TEST(DevmemPathDouble, PeerCloseMidTransferFailsEveryPendingChunk) {
  RawPeer p;
  Buffer d0 = poisoned(kHostMem, 1 << 20), d1 = poisoned(kHostMem, 4096);
  ASSERT_TRUE(p.path->post_rx(0, desc(1 << 20), d0.region()).ok());
  ASSERT_TRUE(p.path->post_rx(1, desc(4096), d1.region()).ok());
  p.write(random_bytes(300000));
  p.raw.reset();
  ASSERT_TRUE(p.ev.wait_failed());
  Status f = p.ev.failed().front();
  EXPECT_TRUE(f.code() == Code::kClosed || f.code() == Code::kPeerFailed) << f.to_string();
  EXPECT_EQ(f.peer(), "evil-peer:7");
  EXPECT_FALSE(p.ev.rx(0).ok());
  EXPECT_FALSE(p.ev.rx(1).ok());
  p.path->stop();
  EXPECT_TRUE(p.ev.wait_stopped());
  EXPECT_EQ(p.nic.outstanding_tokens(), 0u);
}

TEST(DevmemPathDouble, SenderFailsWhenThePeerIsGone) {
  SimNic nic;
  Recorder ev;
  auto [x, y] = tcp_pair();
  auto path = make_path(std::move(x), nic, "gone-peer");
  path->start(&ev, nullptr);
  y.reset();  // the peer's socket closes (RST once data arrives)
  std::vector<test::Filled> src;
  for (int i = 0; i < 4; ++i) src.push_back(filled(kSimMem, 16u << 20));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(path->post_tx(i, src[i].buf.region(), true).ok());
  ASSERT_TRUE(ev.wait_failed());
  EXPECT_EQ(ev.failed().front().peer(), "gone-peer");
  for (int i = 0; i < 4; ++i) (void)ev.tx(i);  // every chunk completes (staged ones ok, others with the error)
  EXPECT_TRUE(ev.exactly_once());
  path->stop();
  EXPECT_TRUE(ev.wait_stopped());
}

TEST(DevmemPathDouble, StopWithPendingChunksCompletesThemAndStopsOnce) {
  PathPair pp;
  // B waits for chunks A never sends, and sends chunks A never reads: more than the socket
  // buffers hold stays pending in B.
  std::vector<Buffer> dst;
  for (int i = 0; i < 3; ++i) dst.push_back(poisoned(kHostMem, 1 << 20));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pp.b->post_rx(i, desc(1 << 20), dst[i].region()).ok());
  std::vector<test::Filled> src;
  for (int i = 0; i < 6; ++i) src.push_back(filled(kSimMem, 16u << 20));
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(pp.b->post_tx(100 + i, src[i].buf.region(), true).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto t0 = std::chrono::steady_clock::now();
  pp.b->stop();
  pp.b->stop();  // idempotent
  EXPECT_LT(std::chrono::steady_clock::now() - t0, test::kLoadSlack) << "stop is prompt";
  ASSERT_TRUE(pp.ev_b.wait_stopped());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(pp.ev_b.rx(i).code(), Code::kClosed);
  int failed_tx = 0;
  for (int i = 0; i < 6; ++i) failed_tx += pp.ev_b.tx(100 + i).ok() ? 0 : 1;
  EXPECT_GT(failed_tx, 0) << "some sends could not even be staged (ring full) and complete with the error";
  EXPECT_TRUE(pp.ev_b.exactly_once());
  EXPECT_EQ(pp.ev_b.stopped(), 1);
  EXPECT_FALSE(pp.b->post_rx(9, desc(1), dst[0].region().sub(0, 1)).ok());
  EXPECT_FALSE(pp.b->post_tx(9, src[0].buf.region(), true).ok());
  EXPECT_EQ(pp.nic_b.outstanding_tokens(), 0u);
  EXPECT_EQ(pp.nic_b.unknown_returns(), 0u);
  pp.a->stop();
  ASSERT_TRUE(pp.ev_a.wait_stopped());
  EXPECT_EQ(pp.ev_a.stopped(), 1);
}

TEST(DevmemPathDouble, StopBeforeStartStillReportsStoppedAfterTheCompletions) {
  SimNic nic;
  Recorder ev;
  auto [x, y] = tcp_pair();
  auto path = make_path(std::move(x), nic, "p");
  Buffer d = poisoned(kHostMem, 10);
  ASSERT_TRUE(path->post_rx(0, desc(10), d.region()).ok());
  path->stop();
  path->start(&ev, nullptr);
  ASSERT_TRUE(ev.wait_stopped());
  EXPECT_EQ(ev.rx(0).code(), Code::kClosed);
}

TEST(DevmemPathDouble, MalformedDescriptorsAreProtocolErrors) {
  SimNic nic;
  auto [x, y] = tcp_pair();
  auto path = make_path(std::move(x), nic, "p");
  std::vector<unsigned char> seven(7, 1);
  EXPECT_EQ(path->chunk_length(seven).status().code(), Code::kProtocol);
  EXPECT_EQ(path->chunk_length(desc(kDevmemMaxChunk + 1)).status().code(), Code::kProtocol);
  EXPECT_EQ(*path->chunk_length(desc(kDevmemMaxChunk)), kDevmemMaxChunk);
  auto big = filled(kSimMem, kDevmemMaxChunk + 1);
  EXPECT_FALSE(path->post_tx(0, big.buf.region(), true).ok());
  Buffer d = poisoned(kHostMem, 10);
  EXPECT_FALSE(path->post_rx(0, desc(11), d.region()).ok()) << "dst size must equal the announced length";
}

TEST(DevmemPathDouble, BindingsAreReleasedWithThePath) {
  SimNic nic;
  {
    auto [x, y] = tcp_pair();
    auto path = make_path(std::move(x), nic, "p");
    EXPECT_EQ(nic.open_bindings(), 2u);
  }
  EXPECT_EQ(nic.open_bindings(), 0u);
}

// Defect 2: a second endpoint through the same NIC queues must not bind them again (the kernel
// answers EEXIST); it shares the process's binding, which lives until the last path lets go.
TEST(DevmemPathDouble, SecondPathSharesTheRxBinding) {
  SimNic nic;
  auto [x1, y1] = tcp_pair();
  auto [x2, y2] = tcp_pair();
  auto p1 = make_path(std::move(x1), nic, "p1");
  ASSERT_TRUE(p1);
  auto p2 = make_devmem_path(std::move(x2), config(), "p2", nic.seams());
  ASSERT_TRUE(p2.ok()) << p2.status().to_string();
  EXPECT_EQ(nic.open_bindings(), 3u);  // one RX binding, two TX rings
  p1.reset();
  EXPECT_EQ(nic.open_bindings(), 2u);  // the RX binding stays for p2
  // Bytes still flow into the shared pool: p2 <- a path over the other end on its own "host".
  SimNic other{SimNicOptions{"simdev0", 5}};
  auto q2 = make_path(std::move(y2), other, "q2");
  Recorder ev_p, ev_q;
  (*p2)->start(&ev_p, nullptr);
  q2->start(&ev_q, nullptr);
  auto src = filled(kSimMem, 300001);
  Buffer dst = poisoned(kHostMem, 300001);
  ASSERT_TRUE((*p2)->post_rx(0, desc(300001), dst.region()).ok());
  auto d = q2->post_tx(0, src.buf.region(), true);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(ev_p.rx(0).ok());
  EXPECT_TRUE(read_back(dst.region()) == src.data);
  (*p2)->stop();
  q2->stop();
  EXPECT_TRUE(ev_p.wait_stopped());
  EXPECT_TRUE(ev_q.wait_stopped());
  p2->reset();
  EXPECT_EQ(nic.open_bindings(), 0u);
  EXPECT_EQ(nic.outstanding_tokens(), 0u);
}

// Defect 2: when the queues are bound by someone else, the path is refused with kUnavailable and
// the kernel's reason, so that the engine offers the next transport.
TEST(DevmemPathDouble, QueuesHeldElsewhereGiveANoFreeQueueReason) {
  SimNic nic;
  auto held = nic.occupy_queues({12, 13});
  auto [x, y] = tcp_pair();
  auto p = make_devmem_path(std::move(x), config(), "p", nic.seams());
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Code::kUnavailable) << p.status().to_string();
  EXPECT_NE(p.status().message().find("no free RX queue"), std::string::npos) << p.status().to_string();
  EXPECT_NE(p.status().message().find("designated queue already memory provider bound"), std::string::npos)
      << p.status().to_string();
  EXPECT_EQ(nic.open_bindings(), 0u);
  held.reset();
  auto q = make_devmem_path(std::move(y), config(), "q", nic.seams());
  EXPECT_TRUE(q.ok()) << q.status().to_string();
}

// TX per registered region: a source inside registered memory goes straight from it (bound for TX
// once, at its first send, released with the registration); other sources go through the ring,
// and the counters and describe() say which.
TEST(DevmemPathDouble, TxFromARegisteredRegionSkipsTheRing) {
  PathPair pp;
  auto big = filled(kSimMem, (3 << 20) + 5);
  auto reg = devmem::register_tx_region(big.buf.region());
  size_t bindings_before = pp.nic_a.open_bindings();
  // Two chunks from inside it, at odd offsets, then one from unregistered memory.
  MemRegion c0 = big.buf.region().sub(7, 1000003), c1 = big.buf.region().sub(1000010, 2 << 20);
  auto other = filled(kSimMem, 4099);
  std::vector<MemRegion> srcs = {c0, c1, other.buf.region()};
  std::vector<Buffer> dst;
  for (size_t i = 0; i < srcs.size(); ++i) {
    dst.push_back(poisoned(kHostMem, srcs[i].size));
    Status pr = pp.b->post_rx(i, desc(srcs[i].size), dst.back().region());
    ASSERT_TRUE(pr.ok()) << pr.to_string();
    ASSERT_TRUE(pp.a->post_tx(i, srcs[i], true).ok());
  }
  for (size_t i = 0; i < srcs.size(); ++i) {
    ASSERT_TRUE(pp.ev_a.tx(i).ok());
    ASSERT_TRUE(pp.ev_b.rx(i).ok());
  }
  EXPECT_TRUE(read_back(dst[0].region()) == std::vector<unsigned char>(big.data.begin() + 7, big.data.begin() + 7 + 1000003));
  EXPECT_TRUE(read_back(dst[1].region()) ==
              std::vector<unsigned char>(big.data.begin() + 1000010, big.data.begin() + 1000010 + (2 << 20)));
  EXPECT_TRUE(read_back(dst[2].region()) == other.data);
  DevmemPathCounters c;
  ASSERT_TRUE(devmem_path_counters(*pp.a, &c));
  EXPECT_EQ(c.direct_sends, 2u);
  EXPECT_EQ(c.ring_sends, 1u);
  EXPECT_EQ(c.stagings, 1u);
  EXPECT_NE(c.tx_note.find("ring: the source is not inside registered memory"), std::string::npos) << c.tx_note;
  EXPECT_EQ(pp.nic_a.open_bindings(), bindings_before + 1);  // the region's TX binding, made once
  pp.expect_clean();
  pp.a.reset();
  reg.reset();  // the registration goes: its binding with it
  EXPECT_EQ(pp.nic_a.open_bindings(), 0u);
}

TEST(DevmemPathRealHost, OfferGivesThePreciseReasonOnThisMachine) {
  auto off = Config::resolve();
  ASSERT_TRUE(off.ok());
  Status s = devmem_path_offer(*off);
  EXPECT_EQ(s.code(), Code::kUnavailable);
  EXPECT_EQ(s.message(), "devmem: off (setting devmem_ifname is empty)");
  Options o;
  o.set("devmem_ifname", "lo");
  auto lo = Config::resolve(o);
  ASSERT_TRUE(lo.ok());
  Status l = devmem_path_offer(*lo);
  EXPECT_EQ(l.code(), Code::kUnavailable);
  EXPECT_EQ(l.message().rfind("devmem: ", 0), 0u) << l.message();
  std::cout << "devmem_path_offer(devmem_ifname=lo) on this machine: " << l.to_string() << "\n";
  o.set("devmem_ifname", "no-such-if0");
  auto none = Config::resolve(o);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(devmem_path_offer(*none).message(), "devmem: no interface named no-such-if0");
}

}  // namespace
}  // namespace dmx
