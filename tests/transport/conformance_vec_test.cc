// The conformance suite's vectored cases, over every transport (conformance.h): scattered blocks of
// a paged cache written and read back byte-exact with one completion and one notification; gather
// and scatter of one message whose pieces do not line up; lists of 0, 1 and 100,000 entries; bad
// lists refused whole, naming the entry; cancel midway and a deadline; a peer killed midway.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "core/sys.h"
#include "engine/test_util.h"
#include "transport/conformance.h"
#include "transport/transport_test_util.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;

constexpr unsigned char kPoison = 0xA5;

// list_threads 3: long lists are checked and laid out in parts by a crew, on any machine.
Options vec_options() {
  Options o = test_options(2);
  o.set("chunk_size", "1M").set("keepalive_interval", "20s").set("peer_timeout", kPatientPeerTimeout);
  o.set("list_threads", "3");
  return o;
}

std::mt19937_64& rng() {
  static std::mt19937_64 r{std::random_device{}()};
  return r;
}

// `n` distinct block ids out of `blocks`, in random order.
std::vector<uint64_t> pick(uint64_t blocks, size_t n) {
  std::vector<uint64_t> ids(blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng());
  ids.resize(n);
  return ids;
}

class ConformanceVec : public ::testing::TestWithParam<Harness> {
 protected:
  void SetUp() override {
    if (std::string why = GetParam().unavailable(); !why.empty()) GTEST_SKIP() << why;
    auto s = GetParam().make_context(0, vec_options());
    auto c = GetParam().make_context(1, vec_options());
    ASSERT_TRUE(s.ok() && c.ok()) << s.status().to_string() << " " << c.status().to_string();
    server_ctx_ = *s;
    client_ctx_ = *c;
    auto l = server_ctx_.listen("tcp://127.0.0.1:0");
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    listener_ = std::move(*l);
    auto ce = client_ctx_.connect(listener_.address());
    ASSERT_TRUE(ce.ok()) << ce.status().to_string();
    auto se = listener_.accept(kEventually);
    ASSERT_TRUE(se.ok()) << se.status().to_string();
    client_ = std::move(*ce);
    server_ = std::move(*se);
  }
  MemSpec mem() const { return GetParam().mem; }

  Context server_ctx_, client_ctx_;
  Listener listener_;
  Endpoint client_, server_;
};

// What a list of entries makes of `dst` (a copy of its bytes before), from `src` images.
void apply(std::vector<unsigned char>& dst, const std::vector<std::vector<unsigned char>>& src,
           const std::vector<IoEntry>& entries, bool write) {
  for (const IoEntry& e : entries) {
    if (write) std::copy_n(src[e.local].begin() + e.local_offset, e.length, dst.begin() + e.remote_offset);
    else std::copy_n(src[e.remote].begin() + e.remote_offset, e.length, dst.begin() + e.local_offset);
  }
}

// Blocks of a paged cache in two local regions written to random blocks of a remote cache
// registered as two regions, then read back: odd sizes and offsets, runs of adjacent blocks
// (merged), a zero-length entry; one completion and one notification.
TEST_P(ConformanceVec, WriteAndReadScatteredBlocksByteExact) {
  constexpr uint64_t kS = 4099, kBlocks = 96;
  Filled a = filled(mem(), kBlocks * kS), b = filled(mem(), 32 * kS);
  Buffer d0 = poisoned(mem(), 64 * kS), d1 = poisoned(mem(), 64 * kS);
  auto r0 = server_ctx_.register_memory(d0.region());
  auto r1 = server_ctx_.register_memory(d1.region());
  ASSERT_TRUE(r0.ok() && r1.ok());
  MemRegion local[] = {a.buf.region(), b.buf.region()};
  RemoteRegion remote[] = {r0->remote(), r1->remote()};
  std::vector<IoEntry> entries;
  auto src_ids = pick(kBlocks, 60), dst_ids = pick(120, 64);  // 124..127: the run below
  for (size_t i = 0; i < 56; ++i) {
    uint64_t d = dst_ids[i];
    uint64_t skew = i % 3 == 0 ? 3 : 0;  // odd offsets and lengths
    entries.push_back(IoEntry{0, static_cast<uint32_t>(d / 64), src_ids[i] * kS + skew, (d % 64) * kS + skew, kS - skew});
  }
  entries.push_back(IoEntry{1, 0, 0, 0, 0});  // zero length: fine anywhere in bounds
  for (uint64_t k = 0; k < 4; ++k)            // a run of adjacent blocks both sides: one segment
    entries.push_back(IoEntry{1, 1, (10 + k) * kS, (60 + k) * kS, kS});
  OpOptions notify;
  notify.notify = true;
  notify.notify_value = 0xC0FFEE;
  Request w = client_.write_vec(local, remote, entries, notify);
  ASSERT_TRUE(w.wait(kEventually).ok()) << w.status().to_string();
  uint64_t total = 0;
  for (const auto& e : entries) total += e.length;
  EXPECT_EQ(w.bytes(), total);
  auto note = server_.next_notification(10s);
  ASSERT_TRUE(note.ok()) << note.status().to_string();
  EXPECT_EQ(note->value, 0xC0FFEEu);
  EXPECT_EQ(note->length, total);
  // The expected image of each remote region: poison, then every entry's bytes.
  std::vector<std::vector<unsigned char>> srcs = {a.data, b.data};
  for (uint32_t r = 0; r < 2; ++r) {
    std::vector<unsigned char> want(64 * kS, kPoison);
    std::vector<IoEntry> mine;
    for (const auto& e : entries)
      if (e.remote == r) mine.push_back(e);
    apply(want, srcs, mine, true);
    ASSERT_TRUE(read_back((r == 0 ? d0 : d1).region()) == want) << "remote region " << r << " differs";
  }
  // Read random blocks back into a fresh cache.
  std::vector<std::vector<unsigned char>> remotes = {read_back(d0.region()), read_back(d1.region())};
  Buffer back = poisoned(mem(), kBlocks * kS + 5);
  MemRegion back_local[] = {back.region()};
  std::vector<IoEntry> reads;
  auto from = pick(128, 50), into = pick(kBlocks, 50);
  for (size_t i = 0; i < 50; ++i)
    reads.push_back(IoEntry{0, static_cast<uint32_t>(from[i] / 64), into[i] * kS + 5, (from[i] % 64) * kS, kS - (i % 2)});
  Request r = client_.read_vec(back_local, remote, reads);
  ASSERT_TRUE(r.wait(kEventually).ok()) << r.status().to_string();
  std::vector<unsigned char> want(kBlocks * kS + 5, kPoison);
  apply(want, remotes, reads, false);
  ASSERT_TRUE(read_back(back.region()) == want) << "read_vec landed the wrong bytes";
  // rdma moves a list as one chunk (rdma_path.h): the write's 60 segments and the read's 50 went
  // in a few chunks each, not one a block.
  if (GetParam().path == "rdma") {
    auto chunks = [&](Endpoint& e) {
      uint64_t n = 0;
      for (const auto& p : e.stats().paths)
        if (p.name == "rdma") n += p.chunks_sent;
      return n;
    };
    EXPECT_GT(chunks(client_), 0u);
    EXPECT_LT(chunks(client_), 10u) << "the write's blocks went one by one";
    EXPECT_GT(chunks(server_), 0u);
    EXPECT_LT(chunks(server_), 10u) << "the read's blocks went one by one";
  }
}

// One message from pieces that the receiver cuts elsewhere (chunks span its pieces), small (eager)
// and large (rendezvous); a vectored send into a plain recv and the other way round.
TEST_P(ConformanceVec, SendAndRecvGatherAndScatterOneMessage) {
  for (uint64_t total : {uint64_t{301}, uint64_t{(3 << 20) + 77}}) {
    Filled src = filled(mem(), total + 11);
    Buffer dst = poisoned(mem(), total + 40);
    // Sender: pieces in scrambled order of the source; receiver: other cuts, gaps between them.
    std::vector<IoPiece> out, in;
    std::vector<unsigned char> message;
    for (uint64_t at = 0, k = 0; at < total; ++k) {
      uint64_t len = std::min<uint64_t>(total - at, k % 2 ? 1 + total / 7 : total / 3 + 1);
      out.push_back(IoPiece{0, 0, 11 + at, len});
      at += len;
    }
    std::reverse(out.begin(), out.end());
    for (const auto& p : out)
      message.insert(message.end(), src.data.begin() + p.offset, src.data.begin() + p.offset + p.length);
    uint64_t place = 0;
    for (uint64_t at = 0, k = 0; at < total; ++k) {
      uint64_t len = std::min<uint64_t>(total - at, 1 + total / 5 + k);
      in.push_back(IoPiece{0, 0, place, len});
      place += len + (k % 3);  // gaps of 0..2 bytes stay poisoned
      at += len;
    }
    ASSERT_LE(place, total + 40);
    MemRegion sreg[] = {src.buf.region()}, dreg[] = {dst.region()};
    Request r = server_.recv_vec(dreg, in, 7);
    Request s = client_.send_vec(sreg, out, 7);
    ASSERT_TRUE(s.wait(kEventually).ok()) << s.status().to_string();
    ASSERT_TRUE(r.wait(kEventually).ok()) << r.status().to_string();
    EXPECT_EQ(r.bytes(), total);
    std::vector<unsigned char> want(total + 40, kPoison);
    uint64_t at = 0;
    for (const auto& p : in) {
      std::copy_n(message.begin() + at, p.length, want.begin() + p.offset);
      at += p.length;
    }
    ASSERT_TRUE(read_back(dst.region()) == want) << total << " B: recv_vec scattered the wrong bytes";
    // A vectored send into a plain recv, a plain send into a vectored recv.
    Buffer plain = poisoned(mem(), total);
    Request pr = server_.recv(plain.region(), 8);
    ASSERT_TRUE(client_.send_vec(sreg, out, 8).wait(kEventually).ok());
    ASSERT_TRUE(pr.wait(kEventually).ok()) << pr.status().to_string();
    ASSERT_TRUE(read_back(plain.region()) == message) << total << " B: send_vec gathered the wrong bytes";
    Buffer again = poisoned(mem(), total + 40);
    MemRegion areg[] = {again.region()};
    Request vr = server_.recv_vec(areg, in, 9);
    ASSERT_TRUE(client_.send(src.buf.region().sub(11, total), 9).wait(kEventually).ok());
    ASSERT_TRUE(vr.wait(kEventually).ok()) << vr.status().to_string();
    std::vector<unsigned char> want2(total + 40, kPoison);
    at = 0;
    for (const auto& p : in) {
      std::copy_n(src.data.begin() + 11 + at, p.length, want2.begin() + p.offset);
      at += p.length;
    }
    ASSERT_TRUE(read_back(again.region()) == want2);
  }
}

// Lists of 0, 1 and 100,000 entries.
TEST_P(ConformanceVec, ListsOfZeroOneAndAHundredThousandEntries) {
  constexpr uint64_t kN = 100'000, kS = 8;
  Filled src = filled(mem(), kN * kS);
  Buffer dst = poisoned(mem(), kN * kS + 64), small = poisoned(mem(), 256);
  auto reg = server_ctx_.register_memory(dst.region());
  auto small_reg = server_ctx_.register_memory(small.region());
  ASSERT_TRUE(reg.ok() && small_reg.ok());
  MemRegion local[] = {src.buf.region()};
  RemoteRegion remote[] = {reg->remote()}, small_remote[] = {small_reg->remote()};
  OpOptions notify;
  notify.notify = true;
  notify.notify_value = 1;
  Request none = client_.write_vec(local, remote, {}, notify);
  ASSERT_TRUE(none.wait(kEventually).ok()) << none.status().to_string();
  auto note = server_.next_notification(10s);
  ASSERT_TRUE(note.ok()) << note.status().to_string();
  EXPECT_EQ(note->length, 0u);
  EXPECT_TRUE(client_.read_vec(local, remote, {}).wait(kEventually).ok());
  // Read back once the target has its notification (the data has landed there), never on the
  // initiator's completion alone: with both contexts in this process, the hand-over between them
  // is shared memory mapped twice, which ThreadSanitizer does not see. Into a region of its own,
  // so that no later write lands where this thread has read.
  IoEntry one[] = {{0, 0, 3, 64 + 5, 77}};
  notify.notify_value = 3;
  ASSERT_TRUE(client_.write_vec(local, small_remote, one, notify).wait(kEventually).ok());
  note = server_.next_notification(10s);
  ASSERT_TRUE(note.ok()) << note.status().to_string();
  EXPECT_EQ(note->value, 3u);
  std::vector<unsigned char> got = read_back(small.region().sub(64 + 5, 77));
  EXPECT_TRUE(std::equal(got.begin(), got.end(), src.data.begin() + 3));
  // 100,000 8-byte blocks: block i of the source to block perm[i] of the target, where perm moves
  // runs of kRun blocks (adjacent both sides: merged) to random places, so that the list is
  // checked and laid out whole but moves as kN / kRun chunks (the suite's time budget).
  constexpr uint64_t kRun = 20;
  std::vector<uint64_t> runs = pick(kN / kRun, kN / kRun), perm(kN);
  for (uint64_t i = 0; i < kN; ++i) perm[i] = runs[i / kRun] * kRun + i % kRun;
  std::vector<IoEntry> many(kN);
  for (uint64_t i = 0; i < kN; ++i) many[i] = IoEntry{0, 0, i * kS, 64 + perm[i] * kS, kS};
  // The same list with one block named twice: refused whole, naming the later of the two.
  std::uniform_int_distribution<uint64_t> at(0, kN - 1);
  uint64_t a = at(rng()), b = at(rng());
  while (b == a) b = at(rng());
  auto twice = many;
  twice[b].remote_offset = twice[a].remote_offset;
  Request bad = client_.write_vec(local, remote, twice);
  EXPECT_EQ(bad.wait(kEventually).code(), Code::kInvalidArgument) << bad.status().to_string();
  EXPECT_EQ(bad.failed_entry(), static_cast<int64_t>(std::max(a, b)));
  notify.notify_value = 2;
  Request w = client_.write_vec(local, remote, many, notify);
  ASSERT_TRUE(w.wait(2 * kEventually).ok()) << w.status().to_string();
  note = server_.next_notification(10s);
  ASSERT_TRUE(note.ok());
  EXPECT_EQ(note->value, 2u);
  EXPECT_EQ(note->length, kN * kS);
  got = read_back(dst.region());
  for (uint64_t i = 0; i < kN; ++i)
    ASSERT_TRUE(std::equal(src.data.begin() + i * kS, src.data.begin() + (i + 1) * kS, got.begin() + 64 + perm[i] * kS))
        << "block " << i;
}

// A bad entry anywhere refuses the whole list before a byte moves, naming the entry; the endpoint
// goes on.
TEST_P(ConformanceVec, BadListsAreRefusedWholeNamingTheEntry) {
  Filled src = filled(mem(), 8192);
  Buffer dst = poisoned(mem(), 4096);
  auto reg = server_ctx_.register_memory(dst.region());
  ASSERT_TRUE(reg.ok());
  MemRegion local[] = {src.buf.region()};
  RemoteRegion remote[] = {reg->remote()};
  std::vector<IoEntry> good;
  for (uint64_t i = 0; i < 8; ++i) good.push_back(IoEntry{0, 0, i * 100, 4000 - (i + 1) * 200, 100});
  auto expect_refused = [&](Request r, Code code, int64_t index) {
    Status s = r.wait(kEventually);
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_EQ(r.failed_entry(), index) << s.to_string();
    EXPECT_EQ(s.message().rfind("entry " + std::to_string(index) + ":", 0), 0u) << s.to_string();
  };
  auto with = [&](size_t at, IoEntry e) {
    auto l = good;
    l[at] = e;
    return l;
  };
  expect_refused(client_.write_vec(local, remote, with(5, {0, 0, 8150, 0, 100})), Code::kOutOfRange, 5);
  expect_refused(client_.write_vec(local, remote, with(3, {0, 0, 0, 4090, 7})), Code::kOutOfRange, 3);
  expect_refused(client_.write_vec(local, remote, with(6, {0, 0, 0, UINT64_MAX - 2, 5})), Code::kOutOfRange, 6);
  expect_refused(client_.write_vec(local, remote, with(2, {0, 1, 0, 0, 1})), Code::kInvalidArgument, 2);
  expect_refused(client_.write_vec(local, remote, with(4, {1, 0, 0, 0, 1})), Code::kInvalidArgument, 4);
  // Overlapping destinations: entry 7 lands on entry 1's bytes.
  expect_refused(client_.write_vec(local, remote, with(7, {0, 0, 0, 4000 - 2 * 200 + 50, 100})),
                 Code::kInvalidArgument, 7);
  // A read whose local ranges overlap; sources may overlap.
  std::vector<IoEntry> rd = {{0, 0, 0, 0, 100}, {0, 0, 200, 0, 100}, {0, 0, 150, 100, 100}};
  expect_refused(client_.read_vec(local, remote, rd), Code::kInvalidArgument, 2);
  IoPiece pieces[] = {{0, 0, 0, 10}, {0, 0, 100, 50}, {0, 0, 120, 10}};
  expect_refused(server_.recv_vec(local, pieces, 3), Code::kInvalidArgument, 2);
  IoPiece reserved[] = {{0, 0, 0, 10}, {0, 1, 100, 50}};
  expect_refused(client_.send_vec(local, reserved, 3), Code::kInvalidArgument, 1);
  // The endpoint goes on: the good list lands in another region (notified, then read back: see
  // ListsOfZeroOneAndAHundredThousandEntries), and nothing landed in the first.
  EXPECT_TRUE(client_.health().ok()) << client_.health().to_string();
  Buffer dst2 = poisoned(mem(), 4096);
  auto reg2 = server_ctx_.register_memory(dst2.region());
  ASSERT_TRUE(reg2.ok());
  RemoteRegion remote2[] = {reg2->remote()};
  OpOptions notify;
  notify.notify = true;
  notify.notify_value = 0xB0B;
  Request ok = client_.write_vec(local, remote2, good, notify);
  ASSERT_TRUE(ok.wait(kEventually).ok()) << ok.status().to_string();
  EXPECT_EQ(ok.failed_entry(), -1);
  auto note = server_.next_notification(10s);
  ASSERT_TRUE(note.ok()) << note.status().to_string();
  EXPECT_EQ(note->value, 0xB0Bu);
  std::vector<unsigned char> want(4096, kPoison);
  apply(want, {src.data}, good, true);
  EXPECT_TRUE(read_back(dst2.region()) == want) << "the good list landed the wrong bytes";
  std::vector<unsigned char> untouched = read_back(dst.region());
  EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](unsigned char c) { return c == kPoison; }));
}

// A KV-cache shaped list (thousands of equal blocks at multiples of their size: the check's bitmap,
// no sort) with one block named twice is refused naming the later entry; so is one whose overlap
// is not block-aligned (sorted after all); the distinct list lands. The same for a read.
TEST_P(ConformanceVec, ManyEqualBlocksNamedTwiceAreRefused) {
  constexpr uint64_t kBlocks = 8192, kS = 64, kN = 4096;  // kN: the bitmap's least
  Filled src = filled(mem(), kN * kS);
  Buffer dst = poisoned(mem(), kBlocks * kS);
  auto reg = server_ctx_.register_memory(dst.region());
  ASSERT_TRUE(reg.ok());
  MemRegion local[] = {src.buf.region()};
  RemoteRegion remote[] = {reg->remote()};
  std::vector<uint64_t> ids = pick(kBlocks, kN);
  std::vector<IoEntry> good;
  for (uint64_t i = 0; i < kN; ++i) good.push_back(IoEntry{0, 0, i * kS, ids[i] * kS, kS});
  std::uniform_int_distribution<uint64_t> at(0, kN - 1);
  uint64_t j = at(rng()), k = at(rng());
  while (k == j) k = at(rng());
  auto twice = good;
  twice[k].remote_offset = twice[j].remote_offset;
  Request r = client_.write_vec(local, remote, twice);
  Status s = r.wait(kEventually);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
  EXPECT_EQ(r.failed_entry(), static_cast<int64_t>(std::max(j, k))) << s.to_string();
  // Not block-aligned: k straddles j's block and a neighbour, which another entry may name too;
  // the refusal names the smallest later index of the pairs k is in.
  auto skewed = good;
  uint64_t start = ids[j] + 1 < kBlocks ? ids[j] * kS + 1 : ids[j] * kS - 1;
  skewed[k].remote_offset = start;
  int64_t expect = -1;
  for (uint64_t m = 0; m < kN; ++m)
    if (m != k && skewed[m].remote_offset < start + kS && start < skewed[m].remote_offset + kS) {
      auto later = static_cast<int64_t>(std::max(m, k));
      if (expect < 0 || later < expect) expect = later;
    }
  Request r2 = client_.write_vec(local, remote, skewed);
  EXPECT_EQ(r2.wait(kEventually).code(), Code::kInvalidArgument);
  EXPECT_EQ(r2.failed_entry(), expect);
  // Notified, then read back: the notification orders the target's stores before the reads here
  // (the write's completion comes over the shm pipe, which ThreadSanitizer cannot see through).
  OpOptions notify;
  notify.notify = true;
  notify.notify_value = 0x5EE;
  Request ok = client_.write_vec(local, remote, good, notify);
  ASSERT_TRUE(ok.wait(kEventually).ok()) << ok.status().to_string();
  auto note = server_.next_notification(10s);
  ASSERT_TRUE(note.ok()) << note.status().to_string();
  EXPECT_EQ(note->value, 0x5EEu);
  std::vector<unsigned char> want(kBlocks * kS, kPoison);
  apply(want, {src.data}, good, true);
  EXPECT_TRUE(read_back(dst.region()) == want) << "the distinct list landed the wrong bytes";
  // A read's destinations are its own addresses, blocks at a multiple of kS from wherever the
  // lowest is (here 3 bytes into the buffer): one block named twice is refused naming the later
  // entry, and the distinct list reads the blocks back.
  Buffer mine = poisoned(mem(), kBlocks * kS + 3);
  MemRegion rlocal[] = {mine.region()};
  std::vector<IoEntry> rd;
  for (uint64_t i = 0; i < kN; ++i) rd.push_back(IoEntry{0, 0, 3 + ids[i] * kS, i * kS, kS});
  auto rd_twice = rd;
  rd_twice[k].local_offset = rd_twice[j].local_offset;
  Request r3 = client_.read_vec(rlocal, remote, rd_twice);
  EXPECT_EQ(r3.wait(kEventually).code(), Code::kInvalidArgument);
  EXPECT_EQ(r3.failed_entry(), static_cast<int64_t>(std::max(j, k)));
  Request r4 = client_.read_vec(rlocal, remote, rd);
  ASSERT_TRUE(r4.wait(kEventually).ok()) << r4.status().to_string();
  std::vector<unsigned char> got = read_back(mine.region()), want_rd(kBlocks * kS + 3, kPoison);
  for (uint64_t i = 0; i < kN; ++i)
    std::copy_n(want.begin() + static_cast<ptrdiff_t>(i * kS), kS,
                want_rd.begin() + static_cast<ptrdiff_t>(3 + ids[i] * kS));
  EXPECT_TRUE(got == want_rd) << "the distinct read landed the wrong bytes";
}

// The same check at a block size that is not a power of two, for a write's remote blocks and a
// vectored receive's pieces: one named twice is refused naming the later; a send may name one
// twice (it only reads); the distinct receive lands byte-exact.
TEST_P(ConformanceVec, ManyEqualBlocksOfAnOddSize) {
  constexpr uint64_t kBlocks = 6000, kS = 48, kN = 4096;
  Filled src = filled(mem(), kN * kS);
  Buffer dst = poisoned(mem(), kBlocks * kS + 5);
  auto reg = server_ctx_.register_memory(dst.region());
  ASSERT_TRUE(reg.ok());
  MemRegion local[] = {src.buf.region()};
  RemoteRegion remote[] = {reg->remote()};
  std::vector<uint64_t> ids = pick(kBlocks, kN);
  std::uniform_int_distribution<uint64_t> at(0, kN - 1);
  uint64_t j = at(rng()), k = at(rng());
  while (k == j) k = at(rng());
  std::vector<IoEntry> twice;
  for (uint64_t i = 0; i < kN; ++i) twice.push_back(IoEntry{0, 0, i * kS, ids[i] * kS, kS});
  twice[k].remote_offset = twice[j].remote_offset;
  Request w = client_.write_vec(local, remote, twice);
  EXPECT_EQ(w.wait(kEventually).code(), Code::kInvalidArgument) << w.status().to_string();
  EXPECT_EQ(w.failed_entry(), static_cast<int64_t>(std::max(j, k)));
  // Receives: pieces at 5 + a block each, the message's i-th piece into block ids[i].
  MemRegion dreg[] = {dst.region()};
  std::vector<IoPiece> in;
  for (uint64_t i = 0; i < kN; ++i) in.push_back(IoPiece{0, 0, 5 + ids[i] * kS, kS});
  auto in_twice = in;
  in_twice[k].offset = in_twice[j].offset;
  Request bad = server_.recv_vec(dreg, in_twice, 3);
  EXPECT_EQ(bad.wait(kEventually).code(), Code::kInvalidArgument) << bad.status().to_string();
  EXPECT_EQ(bad.failed_entry(), static_cast<int64_t>(std::max(j, k)));
  // A send naming one source block twice, into the distinct receive.
  std::vector<IoPiece> out;
  for (uint64_t i = 0; i < kN; ++i) out.push_back(IoPiece{0, 0, i * kS, kS});
  out[k].offset = out[j].offset;
  Request r = server_.recv_vec(dreg, in, 4);
  Request s = client_.send_vec(local, out, 4);
  ASSERT_TRUE(s.wait(kEventually).ok()) << s.status().to_string();
  ASSERT_TRUE(r.wait(kEventually).ok()) << r.status().to_string();
  std::vector<unsigned char> want(kBlocks * kS + 5, kPoison);
  for (uint64_t i = 0; i < kN; ++i)
    std::copy_n(src.data.begin() + static_cast<ptrdiff_t>(out[i].offset), kS,
                want.begin() + static_cast<ptrdiff_t>(in[i].offset));
  EXPECT_TRUE(read_back(dst.region()) == want) << "the distinct receive landed the wrong bytes";
}

// Cancel a large list midway and let another pass its deadline: each completes once, the endpoint
// goes on, and a later list lands byte-exact.
TEST_P(ConformanceVec, CancelMidwayAndDeadline) {
  constexpr uint64_t kN = 2048, kS = 4096;
  Filled src = filled(mem(), kN * kS);
  Buffer dst = poisoned(mem(), kN * kS);
  auto reg = server_ctx_.register_memory(dst.region());
  ASSERT_TRUE(reg.ok());
  MemRegion local[] = {src.buf.region()};
  RemoteRegion remote[] = {reg->remote()};
  std::vector<uint64_t> perm = pick(kN, kN);
  std::vector<IoEntry> list(kN);
  for (uint64_t i = 0; i < kN; ++i) list[i] = IoEntry{0, 0, i * kS, perm[i] * kS, kS};
  Request w = client_.write_vec(local, remote, list);
  w.cancel();
  Status s = w.wait(kEventually);
  EXPECT_TRUE(s.ok() || s.code() == Code::kCancelled) << s.to_string();
  // A cancelled write's chunks already on their way may still land in its target after it
  // completed (the completion frees the initiator's memory only): what follows uses other regions.
  Filled other = filled(mem(), kN * kS);
  Buffer dst2 = poisoned(mem(), kN * kS);
  auto reg_other = server_ctx_.register_memory(other.buf.region());
  auto reg2 = server_ctx_.register_memory(dst2.region());
  ASSERT_TRUE(reg_other.ok() && reg2.ok());
  RemoteRegion remote_other[] = {reg_other->remote()}, remote2[] = {reg2->remote()};
  Request rd = client_.read_vec(local, remote_other, list);
  rd.cancel();
  s = rd.wait(kEventually);
  EXPECT_TRUE(s.ok() || s.code() == Code::kCancelled) << s.to_string();
  OpOptions soon;
  soon.timeout = 100ms;
  IoPiece pieces[] = {{0, 0, 0, 10}, {0, 0, 100, 50}};
  Request late = server_.recv_vec(local, pieces, 55, soon);
  EXPECT_EQ(late.wait(kEventually).code(), Code::kTimeout) << late.status().to_string();
  EXPECT_TRUE(client_.health().ok()) << client_.health().to_string();
  OpOptions notify;  // read back once the target has it (ListsOfZeroOneAndAHundredThousandEntries)
  notify.notify = true;
  notify.notify_value = 0xA6A1;
  Request again = client_.write_vec(local, remote2, list, notify);
  ASSERT_TRUE(again.wait(kEventually).ok()) << again.status().to_string();
  auto note = server_.next_notification(10s);
  ASSERT_TRUE(note.ok()) << note.status().to_string();
  EXPECT_EQ(note->value, 0xA6A1u);
  // The cancelled read may have landed some of `other` in `local` before it completed: the
  // write sent what `local` held then.
  std::vector<unsigned char> sent = read_back(src.buf.region()), got = read_back(dst2.region());
  for (uint64_t i = 0; i < kN; ++i)
    ASSERT_TRUE(std::equal(sent.begin() + i * kS, sent.begin() + (i + 1) * kS, got.begin() + perm[i] * kS));
}

// Without the fixture's pair: the child forks before this process has any dmx thread.
class ConformanceVecFork : public ::testing::TestWithParam<Harness> {
 protected:
  void SetUp() override {
    if (std::string why = GetParam().unavailable(); !why.empty()) GTEST_SKIP() << why;
  }
};

// The peer process is killed while vectored messages flow: every pending vectored operation fails
// with kPeerFailed naming the peer, within a bound.
TEST_P(ConformanceVecFork, PeerKilledMidwayFailsPendingLists) {
  const Harness h = GetParam();
  if (!h.no_fork.empty()) DMX_SKIP(kOneProcess) << h.no_fork;
  constexpr uint64_t kTotal = (8 << 20) + 3;
  int to_child[2];
  ASSERT_EQ(::pipe(to_child), 0);
  pid_t child = testing::fork_child([&] {
    ::close(to_child[1]);
    char addr[256] = {};
    if (::read(to_child[0], addr, sizeof addr - 1) <= 0) return 2;
    auto ctx = h.make_context(1, vec_options());
    if (!ctx.ok()) return 3;
    auto ep = ctx->connect(addr);
    if (!ep.ok()) return 4;
    Filled src = filled(h.mem, kTotal);
    MemRegion regions[] = {src.buf.region()};
    IoPiece pieces[] = {{0, 0, kTotal / 2, kTotal - kTotal / 2}, {0, 0, 0, kTotal / 2}};
    for (;;) (void)ep->send_vec(regions, pieces, 1).wait(kEventually);  // until killed
  });
  ::close(to_child[0]);
  UniqueFd pipe_fd(to_child[1]);
  struct Reap {
    pid_t pid;
    bool waited = false;
    ~Reap() {
      if (waited) return;
      ::kill(pid, SIGKILL);
      testing::wait_child(pid, std::chrono::seconds(10));
    }
  } reap{child};
  auto ctx = h.make_context(0, vec_options());
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  auto l = ctx->listen("tcp://127.0.0.1:0");
  ASSERT_TRUE(l.ok());
  std::string addr = l->address();
  ASSERT_EQ(::write(pipe_fd.get(), addr.data(), addr.size()), static_cast<ssize_t>(addr.size()));
  auto ep = l->accept(20s);
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();
  std::vector<Buffer> bufs;
  std::vector<Request> flowing;
  for (int i = 0; i < 6; ++i) {
    bufs.push_back(poisoned(h.mem, kTotal + 100));
    MemRegion regions[] = {bufs.back().region()};
    IoPiece pieces[] = {{0, 0, 50, kTotal / 3}, {0, 0, 60 + kTotal / 3, kTotal - kTotal / 3}};
    flowing.push_back(ep->recv_vec(regions, pieces, 1));
  }
  // A list the peer never sends: it must fail whatever raced the kill.
  Buffer never = poisoned(h.mem, 4096);
  MemRegion never_regions[] = {never.region()};
  IoPiece never_pieces[] = {{0, 0, 100, 10}, {0, 0, 0, 50}};
  Request pending = ep->recv_vec(never_regions, never_pieces, 2);
  ASSERT_TRUE(flowing[0].wait(kEventually).ok()) << flowing[0].status().to_string();
  ::kill(child, SIGKILL);
  auto t0 = Clock::now();
  flowing.push_back(pending);
  for (auto& r : flowing) {
    Status s = r.wait(kEventually);
    if (s.ok() && &r != &flowing.back()) {  // landed whole before the kill
      EXPECT_EQ(r.bytes(), kTotal);
      continue;
    }
    EXPECT_EQ(s.code(), Code::kPeerFailed) << s.to_string();
    EXPECT_NE(s.to_string().find("127.0.0.1"), std::string::npos) << s.to_string();
  }
  EXPECT_LT(Clock::now() - t0, kLoadSlack) << "noticed by peer_timeout, not by the death";
  reap.waited = true;
  EXPECT_EQ(testing::wait_child(child, 10s), 128 + SIGKILL);
}

std::string harness_name(const ::testing::TestParamInfo<Harness>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(Transports, ConformanceVec, ::testing::ValuesIn(harnesses()), harness_name);
INSTANTIATE_TEST_SUITE_P(Transports, ConformanceVecFork, ::testing::ValuesIn(harnesses()), harness_name);

}  // namespace
}  // namespace dmx::test
