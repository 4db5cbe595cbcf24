// One conformance suite over every transport (conformance.h): byte-exact delivery of every kind of
// size at odd offsets, one-sided write and read with the landed notification (each by the
// transport under test), many operations in flight both ways, cancel and deadline, a peer killed
// mid-transfer (the same code and message form on every transport) and a close while busy. Fresh
// random data every run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "core/crc32c.h"
#include "core/sys.h"
#include "engine/test_util.h"
#include "stream/stream.h"
#include "transport/conformance.h"
#include "transport/transport_test_util.h"

namespace dmx::test {

void PrintTo(const Harness& h, std::ostream* os) { *os << h.name; }

namespace {

using namespace std::chrono_literals;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

constexpr size_t kChunk = 1 << 20;  // the chunk_size set below
constexpr unsigned char kPoison = 0xA5;

// Keepalives far apart and a patient peer_timeout: a deadline that waited for a keepalive, or a
// death noticed only by the timeout, shows; a live peer starved by a loaded machine does not.
Options suite_options() {
  Options o = test_options(2);
  o.set("chunk_size", "1M").set("keepalive_interval", "20s").set("peer_timeout", kPatientPeerTimeout);
  return o;
}

class Conformance : public ::testing::TestWithParam<Harness> {
 protected:
  void SetUp() override {
    if (std::string why = GetParam().unavailable(); !why.empty()) GTEST_SKIP() << why;
  }

  struct Pair {
    Context server_ctx, client_ctx;
    Listener listener;
    Endpoint client, server;
  };

  Pair connect(const Options& o = suite_options()) { return connect(o, o); }
  Pair connect(const Options& server, const Options& client) {
    Pair p;
    auto s = GetParam().make_context(0, server);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    auto c = GetParam().make_context(1, client);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    if (!s.ok() || !c.ok()) return p;
    p.server_ctx = *s;
    p.client_ctx = *c;
    auto l = p.server_ctx.listen("tcp://127.0.0.1:0");
    EXPECT_TRUE(l.ok()) << l.status().to_string();
    p.listener = std::move(*l);
    auto ce = p.client_ctx.connect(p.listener.address());
    EXPECT_TRUE(ce.ok()) << ce.status().to_string();
    auto se = p.listener.accept(kEventually);
    EXPECT_TRUE(se.ok()) << se.status().to_string();
    if (ce.ok()) p.client = std::move(*ce);
    if (se.ok()) p.server = std::move(*se);
    return p;
  }

  // Bulk bytes this endpoint received on the transport under test.
  uint64_t transport_bytes_received(const Endpoint& e) const {
    EndpointStats st = e.stats();
    if (GetParam().path.empty()) return st.transport == "tcp" ? st.bytes_received : 0;
    for (const auto& p : st.paths)
      if (p.name == GetParam().path) return p.bytes_received;
    return 0;
  }

  // Sends n bytes from offset 3 of a fresh source into offset 5 of a poisoned destination and
  // checks every byte, and that the bytes around the destination are untouched.
  void send_and_check(Pair& p, size_t n, uint64_t tag) {
    const MemSpec mem = GetParam().mem;
    Filled src = filled(mem, n + 3);
    Buffer dst = poisoned(mem, n + 10);
    Request r = p.server.recv(dst.region().sub(5, n), tag);
    Request s = p.client.send(src.buf.region().sub(3, n), tag);
    ASSERT_TRUE(s.wait(kEventually).ok()) << n << " B: " << s.status().to_string();
    ASSERT_TRUE(r.wait(kEventually).ok()) << n << " B: " << r.status().to_string();
    ASSERT_EQ(r.bytes(), n);
    std::vector<unsigned char> got = read_back(dst.region());
    ASSERT_TRUE(std::equal(src.data.begin() + 3, src.data.end(), got.begin() + 5)) << n << " B differ";
    for (size_t i : {size_t{0}, size_t{4}, n + 5, n + 9}) ASSERT_EQ(got[i], kPoison) << "byte " << i << " of " << n;
  }

  // send_and_check for sizes past 2^31, in the memory of two copies of the data rather than four:
  // the source is filled and checked against the destination a slice at a time.
  void send_and_check_large(Pair& p, size_t n, uint64_t tag) {
    constexpr size_t kSlice = size_t{64} << 20;
    const MemSpec mem = GetParam().mem;
    auto src = Buffer::allocate(mem, n + 3);
    auto dst = Buffer::allocate(mem, n + 10);
    ASSERT_TRUE(src.ok() && dst.ok()) << src.status().to_string() << " " << dst.status().to_string();
    std::vector<unsigned char> poison(kSlice, kPoison);
    for (size_t at = 0; at < n + 10; at += kSlice) {
      const size_t len = std::min(kSlice, n + 10 - at);
      ASSERT_TRUE(copy_memory(dst->region().sub(at, len), MemRegion{poison.data(), len, {}}).ok());
      if (at >= n + 3) continue;
      std::vector<unsigned char> fresh = random_bytes(std::min(kSlice, n + 3 - at));
      ASSERT_TRUE(copy_memory(src->region().sub(at, fresh.size()), MemRegion{fresh.data(), fresh.size(), {}}).ok());
    }
    // 2 GiB over tcp took 263 s, all told, beside stress-ng --cpu 4 on the 2-core machine.
    const auto wait = 2 * kEventually;
    Request r = p.server.recv(dst->region().sub(5, n), tag);
    Request s = p.client.send(src->region().sub(3, n), tag);
    ASSERT_TRUE(s.wait(wait).ok()) << n << " B: " << s.status().to_string();
    ASSERT_TRUE(r.wait(wait).ok()) << n << " B: " << r.status().to_string();
    ASSERT_EQ(r.bytes(), n);
    for (size_t at = 0; at < n; at += kSlice) {
      const size_t len = std::min(kSlice, n - at);
      ASSERT_EQ(read_back(dst->region().sub(5 + at, len)), read_back(src->region().sub(3 + at, len)))
          << "bytes [" << at << ", +" << len << ") of " << n << " differ";
    }
    for (size_t i : {size_t{0}, size_t{4}, n + 5, n + 9})
      ASSERT_EQ(read_back(dst->region().sub(i, 1))[0], kPoison) << "byte " << i << " of " << n;
  }
};

TEST_P(Conformance, SendRecvEveryKindOfSizeAtOddOffsets) {
  Pair p = connect();
  ASSERT_TRUE(p.client.valid() && p.server.valid());
  for (size_t n : {size_t{0}, size_t{1}, size_t{8}, size_t{4097}, size_t{16 << 10}, (size_t{16} << 10) + 1,
                   kChunk - 1, kChunk, kChunk + 1, 3 * kChunk + 7, (size_t{64} << 20) + 3})
    ASSERT_NO_FATAL_FAILURE(send_and_check(p, n, n));
  // The large ones went by the transport under test, not around it.
  EXPECT_GE(transport_bytes_received(p.server), (size_t{64} << 20)) << p.server.stats().reason;
}

// Past 2^31 bytes: lengths and offsets that a 32-bit field would wrap.
TEST_P(Conformance, SendRecvMultiGiB) {
  if (kSanitized) DMX_SKIP(kSanitizer) << "multi-GiB transfers outlast CI's budget";
  Pair p = connect();
  ASSERT_TRUE(p.client.valid() && p.server.valid());
  ASSERT_NO_FATAL_FAILURE(send_and_check_large(p, (size_t{2} << 30) + 4099, 1));
}

// checksum=crc32c on one side turns it on for both: every chunk carries its CRC, each side folds
// them into the operation's CRC, and both equal the CPU's CRC of the source bytes.
TEST_P(Conformance, ChecksumsCoverEveryChunkAndBothSidesAgree) {
  Options with = suite_options();
  with.set("checksum", "crc32c");
  Pair p = connect(suite_options(), with);
  ASSERT_TRUE(p.client.valid() && p.server.valid());
  const MemSpec mem = GetParam().mem;
  const size_t big = kSanitized ? 8 * kChunk + 3 : (size_t{64} << 20) + 3;
  for (size_t n : {size_t{0}, size_t{1}, size_t{8}, size_t{4097}, kChunk + 1, 3 * kChunk + 7, big}) {
    Filled src = filled(mem, n + 3);
    Buffer dst = poisoned(mem, n + 10);
    Request r = p.server.recv(dst.region().sub(5, n), n);
    Request s = p.client.send(src.buf.region().sub(3, n), n);
    ASSERT_TRUE(s.wait(kEventually).ok()) << n << " B: " << s.status().to_string();
    ASSERT_TRUE(r.wait(kEventually).ok()) << n << " B: " << r.status().to_string();
    std::vector<unsigned char> got = read_back(dst.region());
    ASSERT_TRUE(std::equal(src.data.begin() + 3, src.data.end(), got.begin() + 5)) << n << " B differ";
    const uint32_t want = crc32c::of(src.data.data() + 3, n);
    EXPECT_EQ(s.crc32c(), want) << n << " B, sender";
    EXPECT_EQ(r.crc32c(), want) << n << " B, receiver";
  }
  // One-sided: the write's and the read's CRCs are those of the bytes they moved.
  const size_t n = 2 * kChunk + 5;
  Filled target = filled(mem, n + 7);
  auto reg = p.server_ctx.register_memory(target.buf.region());
  ASSERT_TRUE(reg.ok()) << reg.status().to_string();
  Filled src = filled(mem, n);
  Request w = p.client.write(src.buf.region(), reg->remote(), 7);
  ASSERT_TRUE(w.wait(kEventually).ok()) << w.status().to_string();
  EXPECT_EQ(w.crc32c(), crc32c::of(src.data.data(), n));
  Buffer back = poisoned(mem, n);
  Request rd = p.client.read(back.region(), reg->remote(), 7);
  ASSERT_TRUE(rd.wait(kEventually).ok()) << rd.status().to_string();
  EXPECT_EQ(rd.crc32c(), crc32c::of(src.data.data(), n));
  EXPECT_EQ(read_back(back.region()), src.data);
  for (const Endpoint* e : {&p.client, &p.server}) {
    EndpointStats st = e->stats();
    EXPECT_TRUE(st.checksum);
    EXPECT_EQ(st.checksum_errors, 0u);
  }
  EXPECT_GE(transport_bytes_received(p.server), big) << p.server.stats().reason;
}

TEST_P(Conformance, WriteAndReadWithTheLandedNotification) {
  Pair p = connect();
  ASSERT_TRUE(p.client.valid() && p.server.valid());
  const MemSpec mem = GetParam().mem;
  // Past stream::kBulkTransfer (4 MiB): tcp lands the write and the read's reply as bulk.
  const size_t n = 4 * kChunk + 5, at = 3;
  static_assert(4 * kChunk + 5 > stream::kBulkTransfer);
  Buffer target = poisoned(mem, n + 11);
  auto reg = p.server_ctx.register_memory(target.region());
  ASSERT_TRUE(reg.ok()) << reg.status().to_string();
  Filled src = filled(mem, n);
  OpOptions notify;
  notify.notify = true;
  notify.notify_value = 0xFEED;
  const uint64_t write_before = transport_bytes_received(p.server);
  Request w = p.client.write(src.buf.region(), reg->remote(), at, notify);
  ASSERT_TRUE(w.wait(kEventually).ok()) << w.status().to_string();
  // The write's bytes came by the transport under test, not around it (inline on the streams).
  EXPECT_GE(transport_bytes_received(p.server) - write_before, n) << p.server.stats().reason;
  auto note = p.server.next_notification(10s);
  ASSERT_TRUE(note.ok()) << note.status().to_string();
  EXPECT_EQ(note->value, 0xFEEDu);
  EXPECT_EQ(note->key, reg->remote().key);
  EXPECT_EQ(note->length, n);
  std::vector<unsigned char> landed = read_back(target.region());
  EXPECT_TRUE(std::equal(src.data.begin(), src.data.end(), landed.begin() + at));
  EXPECT_EQ(landed[at - 1], kPoison);
  EXPECT_EQ(landed[at + n], kPoison);
  // Read it back into a fresh buffer at an odd offset.
  Buffer back = poisoned(mem, n + 7);
  const uint64_t read_before = transport_bytes_received(p.client);
  Request r = p.client.read(back.region().sub(7, n), reg->remote(), at);
  ASSERT_TRUE(r.wait(kEventually).ok()) << r.status().to_string();
  std::vector<unsigned char> got = read_back(back.region());
  EXPECT_TRUE(std::equal(src.data.begin(), src.data.end(), got.begin() + 7));
  EXPECT_GE(transport_bytes_received(p.client) - read_before, n) << p.client.stats().reason;
  // Outside the region: refused, and the endpoint goes on.
  Request bad = p.client.write(src.buf.region(), reg->remote(), 12, {});
  EXPECT_EQ(bad.wait(kEventually).code(), Code::kOutOfRange) << bad.status().to_string();
  ASSERT_NO_FATAL_FAILURE(send_and_check(p, kChunk + 3, 9));
}

TEST_P(Conformance, ManyOperationsInFlightBothWays) {
  Pair p = connect();
  ASSERT_TRUE(p.client.valid() && p.server.valid());
  const MemSpec mem = GetParam().mem;
  const size_t sizes[] = {1, 4097, (64 << 10) + 1, kChunk + 3, 0, 2 * kChunk + 1};
  std::vector<Filled> out_c, out_s;
  std::vector<Buffer> in_c, in_s;
  for (size_t i = 0; i < 64; ++i) {
    size_t n = sizes[i % std::size(sizes)];
    out_c.push_back(filled(mem, n));
    out_s.push_back(filled(mem, n));
    in_c.push_back(poisoned(mem, n));
    in_s.push_back(poisoned(mem, n));
  }
  exchange_both_ways(p.client, p.server, out_c, out_s, in_c, in_s, 120s);
}

// Messages with one tag match receives in the order they were sent, whichever way each travels
// (inline eager, eager by the path, rendezvous), all posted at once from host and the
// transport's memory. An eager message by cuda_ipc once fell behind a later send's RTS.
TEST_P(Conformance, MessagesKeepTheirOrderWhateverWayEachTravels) {
  Pair p = connect();
  ASSERT_TRUE(p.client.valid() && p.server.valid());
  const MemSpec mem = GetParam().mem;
  const size_t sizes[] = {8, 3 * kChunk + 1, 1, 100000, 0, 4097, kChunk + 5, 16};
  std::vector<Filled> out;
  std::vector<Buffer> in;
  std::vector<Request> recvs, sends;
  for (size_t i = 0; i < 48; ++i) {
    MemSpec where = i % 3 == 2 ? MemSpec{} : mem;
    size_t n = sizes[i % std::size(sizes)] + i;
    out.push_back(filled(where, n));
    in.push_back(poisoned(where, n));
    recvs.push_back(p.server.recv(in.back().region(), 7));
  }
  for (auto& f : out) sends.push_back(p.client.send(f.buf.region(), 7));
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_TRUE(sends[i].wait(kEventually).ok()) << i << ": " << sends[i].status().to_string();
    ASSERT_TRUE(recvs[i].wait(kEventually).ok()) << i << ": " << recvs[i].status().to_string();
    ASSERT_EQ(recvs[i].bytes(), out[i].data.size()) << "receive " << i << " matched another message";
    ASSERT_EQ(read_back(in[i].region()), out[i].data) << i;
  }
}

TEST_P(Conformance, CancelAndDeadlineLeaveTheEndpointWorking) {
  Pair p = connect();
  ASSERT_TRUE(p.client.valid() && p.server.valid());
  Buffer dst = poisoned(GetParam().mem, kChunk);
  OpOptions soon;
  soon.timeout = 100ms;
  auto t0 = Clock::now();
  Request late = p.server.recv(dst.region(), 77, soon);
  EXPECT_EQ(late.wait(kEventually).code(), Code::kTimeout) << late.status().to_string();
  EXPECT_LT(Clock::now() - t0, 100ms + kLoadSlack);
  Request cancelled = p.server.recv(dst.region(), 78);
  cancelled.cancel();
  EXPECT_EQ(cancelled.wait(kEventually).code(), Code::kCancelled) << cancelled.status().to_string();
  // A rendezvous send nobody receives, cancelled by its sender.
  Filled big = filled(GetParam().mem, 4 * kChunk);
  Request unmatched = p.client.send(big.buf.region(), 79);
  std::this_thread::sleep_for(20ms);
  unmatched.cancel();
  EXPECT_EQ(unmatched.wait(kEventually).code(), Code::kCancelled) << unmatched.status().to_string();
  EXPECT_TRUE(p.client.health().ok()) << p.client.health().to_string();
  ASSERT_NO_FATAL_FAILURE(send_and_check(p, 3 * kChunk + 7, 80));
}

// The peer process is killed while it sends: every pending operation fails with kPeerFailed,
// "lost the peer" and the peer's address, within a bound; the same on every transport.
TEST_P(Conformance, PeerKilledMidTransferFailsEveryPendingOperationAlike) {
  const Harness h = GetParam();
  if (!h.no_fork.empty()) DMX_SKIP(kOneProcess) << h.no_fork;
  int to_child[2];
  ASSERT_EQ(::pipe(to_child), 0);
  // The child forks before this process has any dmx thread, and makes its own context.
  pid_t child = testing::fork_child([&] {
    ::close(to_child[1]);
    char addr[256] = {};
    if (::read(to_child[0], addr, sizeof addr - 1) <= 0) return 2;
    auto ctx = h.make_context(1, suite_options());
    if (!ctx.ok()) return 3;
    auto ep = ctx->connect(addr);
    if (!ep.ok()) return 4;
    Filled src = filled(h.mem, 16 * kChunk + 3);
    for (;;) (void)ep->send(src.buf.region(), 1).wait(kEventually);  // until killed
  });
  ::close(to_child[0]);
  UniqueFd pipe_fd(to_child[1]);
  // A failed assertion below returns early: the child must not outlive the test.
  struct Reap {
    pid_t pid;
    bool waited = false;
    ~Reap() {
      if (waited) return;
      ::kill(pid, SIGKILL);
      testing::wait_child(pid, std::chrono::seconds(10));
    }
  } reap{child};
  auto ctx = h.make_context(0, suite_options());
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  auto l = ctx->listen("tcp://127.0.0.1:0");
  ASSERT_TRUE(l.ok());
  std::string addr = l->address();
  ASSERT_EQ(::write(pipe_fd.get(), addr.data(), addr.size()), static_cast<ssize_t>(addr.size()));
  auto ep = l->accept(20s);
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  Buffer dst = poisoned(h.mem, 16 * kChunk + 3);
  ASSERT_TRUE(ep->recv(dst.region(), 1).wait(kEventually).ok());  // the peer's transfers flow
  // The next messages: those that land before the kill complete whole, the others fail; as do
  // receives the peer never sends and a rendezvous send whose CTS never comes.
  std::vector<Buffer> next;
  std::vector<Request> flowing, pending;
  for (int i = 0; i < 8; ++i) {
    next.push_back(poisoned(h.mem, 16 * kChunk + 3));
    flowing.push_back(ep->recv(next.back().region(), 1));
  }
  Buffer small = poisoned(MemSpec{}, 1000);
  for (uint64_t tag = 2; tag < 5; ++tag) pending.push_back(ep->recv(small.region(), tag));
  Filled big = filled(h.mem, 4 * kChunk);
  pending.push_back(ep->send(big.buf.region(), 9));
  // Killed as soon as the first of them has landed: the next is on its way, the others wait.
  ASSERT_TRUE(flowing[0].wait(kEventually).ok()) << flowing[0].status().to_string();
  ::kill(child, SIGKILL);
  auto t0 = Clock::now();
  auto expect_lost = [](const Status& s) {
    EXPECT_EQ(s.code(), Code::kPeerFailed) << s.to_string();
    EXPECT_NE(s.message().find("lost the peer"), std::string::npos) << s.to_string();
    EXPECT_NE(s.to_string().find("127.0.0.1"), std::string::npos) << "the error must name the peer: " << s.to_string();
  };
  // Bytes the peer wrote before it died (into socket buffers, the shm ring) may still land.
  for (auto& r : flowing) {
    Status s = r.wait(kEventually);
    if (s.ok()) EXPECT_EQ(r.bytes(), 16 * kChunk + 3);
    else expect_lost(s);
  }
  for (auto& r : pending) expect_lost(r.wait(kEventually));
  EXPECT_LT(Clock::now() - t0, kLoadSlack) << "noticed by peer_timeout, not by the death";
  EXPECT_EQ(ep->health().code(), Code::kPeerFailed);
  reap.waited = true;
  EXPECT_EQ(testing::wait_child(child, 10s), 128 + SIGKILL);
}

// close() with transfers in flight both ways: it returns ok, every operation on both sides
// completes, and nothing hangs.
TEST_P(Conformance, CloseWhileBusyCompletesEverything) {
  Pair p = connect();
  ASSERT_TRUE(p.client.valid() && p.server.valid());
  const MemSpec mem = GetParam().mem;
  std::vector<Filled> out;
  std::vector<Buffer> in;
  std::vector<Request> client_ops, server_ops;
  for (uint64_t i = 0; i < 16; ++i) {
    out.push_back(filled(mem, 4 * kChunk + i));
    in.push_back(poisoned(mem, 4 * kChunk + i));
  }
  for (uint64_t i = 0; i < 8; ++i) {
    server_ops.push_back(p.server.recv(in[i].region(), i));
    client_ops.push_back(p.client.send(out[i].buf.region(), i));
    client_ops.push_back(p.client.recv(in[8 + i].region(), i));
    server_ops.push_back(p.server.send(out[8 + i].buf.region(), i));
  }
  std::this_thread::sleep_for(2ms);
  auto t0 = Clock::now();
  Status closed = p.client.close();
  EXPECT_TRUE(closed.ok()) << closed.to_string();
  for (auto& r : client_ops) EXPECT_TRUE(r.test()) << "close() returned with an operation pending";
  for (auto& r : server_ops) {
    Status s = r.wait(kEventually);
    EXPECT_NE(s.code(), Code::kTimeout) << s.to_string();
  }
  EXPECT_LT(Clock::now() - t0, kEventually);
}

std::string harness_name(const ::testing::TestParamInfo<Harness>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(Transports, Conformance, ::testing::ValuesIn(harnesses()), harness_name);

}  // namespace
}  // namespace dmx::test
