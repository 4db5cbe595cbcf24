// The shm payload path's lists (post_tx_list / post_rx_list): scattered host pieces gathered into
// the slots as one chunk and scattered over pieces cut elsewhere, into host or simulated device
// memory (with the bounce pool exhausted); the prefix a list takes; descriptors that disagree with
// the pieces; and, through the engine, a vectored write and read of small blocks as a few lists.
// Helpers in shm_path_util.h; every wait has a deadline.
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <random>

#include "engine/shm_path_util.h"
#include "engine/test_util.h"
#include "memory/bounce_pool.h"

namespace dmx {
namespace {

using namespace shm_test;

uint64_t draw() {
  static std::mt19937_64 r{std::random_device{}()};
  return r();
}

// Piece sizes from 1 B up, odd most of them, within `total` bytes.
std::vector<size_t> odd_sizes(size_t count, size_t max_piece, size_t total) {
  std::vector<size_t> sizes;
  size_t sum = 0;
  while (sizes.size() < count) {
    size_t n = 1 + draw() % max_piece;
    if (n > total - sum) break;
    sizes.push_back(n);
    sum += n;
  }
  return sizes;
}

// A list of `sizes` from host pieces at odd offsets of one buffer, scattered over pieces of `to`
// memory cut at other places (random cuts, in reverse order in their buffer, 3 bytes apart);
// checks every byte and that the gaps between the destination pieces are untouched.
void send_list(Pair& p, uint64_t seq, const std::vector<size_t>& sizes, MemSpec to) {
  size_t total = 0;
  for (size_t n : sizes) total += n;
  std::vector<unsigned char> src(total + 7 * sizes.size());
  fill_random(src.data(), src.size());
  std::vector<MemRegion> srcs;
  std::vector<unsigned char> sent;
  size_t at = 0;
  for (size_t n : sizes) {
    at += 7 - (n % 7);  // odd gaps between the pieces
    srcs.push_back(MemRegion{src.data() + at, n, {}});
    sent.insert(sent.end(), src.data() + at, src.data() + at + n);
    at += n;
  }
  // The receiver's cuts: about as many pieces, at other places.
  std::vector<size_t> cuts;
  for (size_t left = total; left > 0;) {
    size_t n = cuts.size() + 1 == kShmMaxList ? left : std::min(left, 1 + draw() % (2 * total / sizes.size() + 1));
    cuts.push_back(n);
    left -= n;
  }
  size_t room = total + 3 * (cuts.size() + 1);
  auto dst = Buffer::allocate(to, room);
  ASSERT_TRUE(dst.ok()) << dst.status().to_string();
  std::vector<unsigned char> before(room);
  fill_random(before.data(), room);
  ASSERT_TRUE(copy_memory(dst->region(), {before.data(), room, {}}).ok());
  std::vector<MemRegion> dsts(cuts.size());
  std::vector<size_t> dst_at(cuts.size());
  size_t end = room;
  for (size_t i = 0; i < cuts.size(); ++i) {  // piece 0 at the buffer's end
    end -= 3 + cuts[i];
    dst_at[i] = end;
    dsts[i] = dst->region().sub(end, cuts[i]);
  }

  size_t taken = 0;
  auto desc = p.a->post_tx_list(seq, srcs, &taken);
  ASSERT_TRUE(desc.ok()) << desc.status().to_string();
  ASSERT_EQ(taken, srcs.size());
  ASSERT_EQ(*p.b->chunk_length(*desc), total);
  Status posted = p.b->post_rx_list(seq, *desc, dsts);
  ASSERT_TRUE(posted.ok()) << posted.to_string();
  Status st = p.ra.wait(true, seq);
  ASSERT_TRUE(st.ok()) << st.to_string();
  st = p.rb.wait(false, seq);
  ASSERT_TRUE(st.ok()) << st.to_string();

  std::vector<unsigned char> got = test::read_back(dst->region()), want = before;
  size_t off = 0;
  for (size_t i = 0; i < cuts.size(); ++i) {
    std::memcpy(want.data() + dst_at[i], sent.data() + off, cuts[i]);
    off += cuts[i];
  }
  for (size_t i = 0; i < room; ++i) ASSERT_EQ(got[i], want[i]) << "byte " << i << " of the destination buffer";
}

// Odd pieces from 1 B to 1 MiB, into host and into simulated device memory, through slots of
// 64 KiB (a slot holds many pieces, a piece spans many slots); one chunk each; a plain chunk after.
TEST(ShmPathList, ScatteredPiecesAreOneChunk) {
  auto p = make_paths(config("8", "64K"));
  ASSERT_TRUE(p->ok());
  EXPECT_EQ(p->a->max_list(), kShmMaxList);
  uint64_t seq = 0;
  for (MemSpec to : {MemSpec{}, MemSpec{MemKind::kSim, 0}}) {
    SCOPED_TRACE(to_string(to));
    ASSERT_NO_FATAL_FAILURE(send_list(*p, seq++, {1}, to));
    ASSERT_NO_FATAL_FAILURE(send_list(*p, seq++, odd_sizes(1024, 4099, kShmMaxChunk), to));
    ASSERT_NO_FATAL_FAILURE(send_list(*p, seq++, odd_sizes(40, 1 << 20, kShmMaxChunk), to));
  }
  EXPECT_EQ(p->a->stats().chunks_sent, seq);
  EXPECT_EQ(p->b->stats().chunks_received, seq);
  ASSERT_NO_FATAL_FAILURE(transfer(*p->a, p->ra, *p->b, p->rb, &seq, 100003, 3, 5));
  EXPECT_TRUE(p->ra.failed().empty());
  EXPECT_TRUE(p->rb.failed().empty());
}

// A device piece in the middle of a slot finds the bounce pool empty (one piece, process-wide):
// the receiver copies that slot in two passes, and every byte still lands.
TEST(ShmPathList, ScatterIntoDeviceMemoryWithTheBouncePoolExhausted) {
  auto p = make_paths(config("8", "256K"));
  ASSERT_TRUE(p->ok());
  struct Restore {
    ~Restore() { set_bounce_limit_for_test(0); }
  } restore;
  set_bounce_limit_for_test(1);
  uint64_t seq = 0;
  for (int i = 0; i < 3; ++i) ASSERT_NO_FATAL_FAILURE(send_list(*p, seq++, odd_sizes(300, 40000, 3 << 20), {MemKind::kSim, 0}));
  auto pool = BouncePool::of({MemKind::kSim, 0});
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->in_use(), 0u) << "bounce buffers not given back";
  EXPECT_TRUE(p->rb.failed().empty());
}

// The prefix a list takes: the wire's 1,024 pieces, kShmMaxChunk bytes, host memory up to the
// first device piece; a device source is not the path's (kUnavailable); every list taken is
// delivered, the receiver dropping some (all destinations null).
TEST(ShmPathList, ListTakesAPrefixWithinItsLimits) {
  auto p = make_paths();
  ASSERT_TRUE(p->ok());
  std::vector<unsigned char> src(kShmMaxChunk + 64);
  fill_random(src.data(), src.size());
  auto sim = Buffer::allocate({MemKind::kSim, 0}, 4096);
  ASSERT_TRUE(sim.ok());
  auto host = [&](size_t off, size_t n) { return MemRegion{src.data() + off, n, {}}; };
  struct Case {
    std::vector<MemRegion> srcs;
    size_t want;
  };
  std::vector<Case> cases;
  cases.push_back({std::vector<MemRegion>(1030, host(1, 3)), 1024});
  cases.push_back({std::vector<MemRegion>(5, host(0, 1 << 20)), 4});
  cases.push_back({{host(0, 10), host(20, 30), sim->region().sub(0, 5), host(60, 5)}, 2});
  uint64_t seq = 0;
  for (Case& c : cases) {
    size_t taken = 0;
    auto desc = p->a->post_tx_list(seq, c.srcs, &taken);
    ASSERT_TRUE(desc.ok()) << desc.status().to_string();
    EXPECT_EQ(taken, c.want);
    uint64_t total = 0;
    for (size_t i = 0; i < taken; ++i) total += c.srcs[i].size;
    EXPECT_EQ(*p->b->chunk_length(*desc), total);
    std::vector<MemRegion> drop;
    for (size_t i = 0; i < taken; ++i) drop.push_back(MemRegion{nullptr, c.srcs[i].size, {}});
    ASSERT_TRUE(p->b->post_rx_list(seq, *desc, drop).ok());
    EXPECT_TRUE(p->ra.wait(true, seq).ok());
    EXPECT_TRUE(p->rb.wait(false, seq).ok());
    ++seq;
  }
  size_t taken = 0;
  MemRegion device_first[] = {sim->region().sub(0, 5), host(0, 5)};
  EXPECT_EQ(p->a->post_tx_list(seq, device_first, &taken).status().code(), Code::kUnavailable);
  MemRegion too_large[] = {host(0, kShmMaxChunk + 1)};
  EXPECT_EQ(p->a->post_tx_list(seq, too_large, &taken).status().code(), Code::kInvalidArgument);
  ASSERT_NO_FATAL_FAILURE(transfer(*p->a, p->ra, *p->b, p->rb, &seq, 4097, 1, 1));
  EXPECT_TRUE(p->rb.failed().empty());
}

// The descriptor is the peer's word: a length other than the pieces' sum, over the path's chunk,
// or a list of no pieces or of more than 1,024 is a protocol error naming the peer; some
// destinations null and others not is the caller's mistake.
TEST(ShmPathList, DescriptorThatDisagreesIsRefused) {
  auto p = make_paths();
  ASSERT_TRUE(p->ok());
  std::vector<unsigned char> dst(8192);
  MemRegion two[] = {{dst.data(), 100, {}}, {dst.data() + 200, 50, {}}};
  for (uint64_t len : {uint64_t{149}, uint64_t{151}, uint64_t{0}, kShmMaxChunk + 1}) {
    Status s = p->b->post_rx_list(0, encode_for_test(len), two);
    EXPECT_EQ(s.code(), Code::kProtocol) << len << ": " << s.to_string();
    EXPECT_NE(s.to_string().find("pid"), std::string::npos) << s.to_string();
  }
  EXPECT_EQ(p->b->post_rx_list(0, encode_for_test(0), {}).code(), Code::kProtocol);
  std::vector<MemRegion> many(kShmMaxList + 1, MemRegion{dst.data(), 1, {}});
  EXPECT_EQ(p->b->post_rx_list(0, encode_for_test(many.size()), many).code(), Code::kProtocol);
  MemRegion mixed[] = {{dst.data(), 100, {}}, {nullptr, 50, {}}};
  EXPECT_EQ(p->b->post_rx_list(0, encode_for_test(150), mixed).code(), Code::kInvalidArgument);
  EXPECT_EQ(p->b->post_rx_list(0, std::vector<unsigned char>(7), two).code(), Code::kProtocol);
  // None of these was taken: seq 0 is still free and moves bytes.
  uint64_t seq = 0;
  ASSERT_NO_FATAL_FAILURE(transfer(*p->a, p->ra, *p->b, p->rb, &seq, 5000, 0, 0));
}

constexpr uint64_t kBlocks = 3000, kS = 4096;

// KV-cache blocks: block i + 1 of a cache (about 4 KiB each, some of odd sizes, at odd offsets)
// to block kBlocks - 1 - i of another, 3 bytes in. The entries (the cache local for a write,
// remote for a read) and what the destination of `dst_size` bytes holds after them.
struct KvBlocks {
  std::vector<IoEntry> entries;
  std::vector<unsigned char> want;
  uint64_t total = 0;
};

KvBlocks kv_blocks(const std::vector<unsigned char>& cache, size_t dst_size, bool write) {
  KvBlocks b;
  b.want.assign(dst_size, 0xA5);
  for (uint64_t i = 0; i < kBlocks; ++i) {
    uint64_t len = i % 500 == 7 ? kS - 1 - i % 3 : kS, from = (i + 1) * kS + i % 5, to = (kBlocks - 1 - i) * kS + 3;
    b.entries.push_back(write ? IoEntry{0, 0, from, to, len} : IoEntry{0, 0, to, from, len});
    std::memcpy(b.want.data() + to, cache.data() + from, len);
    b.total += len;
  }
  return b;
}

// The chunks and bytes an endpoint's shm path received.
std::pair<uint64_t, uint64_t> shm_received(const Endpoint& e) {
  for (const auto& u : e.stats().paths)
    if (u.name == "shm") return {u.chunks_received, u.bytes_received};
  return {0, 0};
}

// Through the engine: a KV-cache shaped write of 3,000 blocks of about 4 KiB over shm goes as a
// few lists, not a chunk per block (nor inline on the stream), and lands byte-exact.
TEST(ShmPathList, WriteVecOfSmallBlocksGoesAsLists) {
  Options o = test::test_options(1);
  o.set("transport", "shm");
  test::Pair p = test::connect_pair(o);
  ASSERT_TRUE(p.client.valid() && p.server.valid());
  test::Filled src = test::filled({}, (kBlocks + 2) * kS);
  Buffer dst = test::poisoned({}, kBlocks * kS + 64);
  auto reg = p.ctx.register_memory(dst.region());
  ASSERT_TRUE(reg.ok()) << reg.status().to_string();
  MemRegion local[] = {src.buf.region()};
  RemoteRegion remote[] = {reg->remote()};
  KvBlocks b = kv_blocks(src.data, dst.size(), /*write=*/true);
  auto before = shm_received(p.server);
  OpOptions notify;
  notify.notify = true;
  Request w = p.client.write_vec(local, remote, b.entries, notify);
  ASSERT_TRUE(w.wait(test::kEventually).ok()) << w.status().to_string();
  ASSERT_TRUE(p.server.next_notification(std::chrono::seconds(10)).ok());
  EXPECT_TRUE(test::read_back(dst.region()) == b.want) << "the blocks landed wrong";
  auto after = shm_received(p.server);
  EXPECT_EQ(after.second - before.second, b.total) << "not every block came by shm";
  EXPECT_GE(after.first - before.first, 3u);
  EXPECT_LE(after.first - before.first, 8u) << "the blocks went chunk by chunk, not as lists";
}

// Through the engine, the other way: a vectored read of 3,000 such blocks comes back as a few
// lists the target sends (READ_DATA tables), byte-exact.
TEST(ShmPathList, ReadVecOfSmallBlocksComesAsLists) {
  Options o = test::test_options(1);
  o.set("transport", "shm");
  test::Pair p = test::connect_pair(o);
  ASSERT_TRUE(p.client.valid() && p.server.valid());
  test::Filled remote_cache = test::filled({}, (kBlocks + 2) * kS);
  Buffer dst = test::poisoned({}, kBlocks * kS + 64);
  auto reg = p.ctx.register_memory(remote_cache.buf.region());
  ASSERT_TRUE(reg.ok()) << reg.status().to_string();
  MemRegion local[] = {dst.region()};
  RemoteRegion remote[] = {reg->remote()};
  KvBlocks b = kv_blocks(remote_cache.data, dst.size(), /*write=*/false);
  auto before = shm_received(p.client);
  Request r = p.client.read_vec(local, remote, b.entries);
  ASSERT_TRUE(r.wait(test::kEventually).ok()) << r.status().to_string();
  EXPECT_EQ(r.bytes(), b.total);
  EXPECT_TRUE(test::read_back(dst.region()) == b.want) << "the blocks landed wrong";
  auto after = shm_received(p.client);
  EXPECT_EQ(after.second - before.second, b.total) << "not every block came by shm";
  EXPECT_GE(after.first - before.first, 3u);
  EXPECT_LE(after.first - before.first, 8u) << "the blocks came chunk by chunk, not as lists";
}

}  // namespace
}  // namespace dmx
