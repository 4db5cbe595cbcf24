// The shm payload path: byte-exact delivery of host chunks (odd sizes and offsets, many in flight
// both ways, copy crews), discards, malformed descriptors and lengths. Device memory is in
// shm_path_device_test.cc, stop and the peer's death in shm_path_stop_test.cc, the helpers in
// shm_path_util.h. Every wait has a deadline.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "engine/shm_path_util.h"

namespace dmx {
namespace {

using namespace shm_test;

TEST(ShmPath, Properties) {
  auto p = make_paths(config("8", "64K"));
  ASSERT_TRUE(p->ok());
  EXPECT_EQ(p->a->name(), "shm");
  EXPECT_EQ(p->a->describe(), "shm 8 x 64 KiB slots");
  EXPECT_EQ(p->b->describe(), "shm 8 x 64 KiB slots");  // the creator's layout
  EXPECT_EQ(p->a->max_chunk(), kShmMaxChunk);
  EXPECT_FALSE(p->a->receiver_releases());
  for (MemKind k : {MemKind::kHost, MemKind::kPinned, MemKind::kCuda, MemKind::kSim})
    EXPECT_TRUE(p->a->carries({k, 0})) << mem_kind_name(k);
  auto d = p->a->post_tx(0, {nullptr, 0, {}}, true);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, std::vector<unsigned char>(8, 0));
  std::vector<unsigned char> big(kShmMaxChunk + 1);
  EXPECT_EQ(p->a->post_tx(1, {big.data(), big.size(), {}}, true).status().code(), Code::kInvalidArgument);
  auto len = p->b->chunk_length(*d);
  ASSERT_TRUE(len.ok());
  EXPECT_EQ(*len, 0u);
  ASSERT_TRUE(p->b->post_rx(0, *d, {nullptr, 0, {}}).ok());
  EXPECT_TRUE(p->ra.wait(true, 0).ok());
  EXPECT_TRUE(p->rb.wait(false, 0).ok());
}

TEST(ShmPath, SizesAndOddOffsets) {
  auto p = make_paths();
  ASSERT_TRUE(p->ok());
  uint64_t seq = 0;
  for (size_t n : {size_t(0), size_t(1), size_t(4097), size_t(1 << 20) + 3, size_t(kShmMaxChunk),
                   size_t(64 << 20) + 3})
    for (auto [so, dso] : {std::pair<size_t, size_t>{0, 0}, {1, 7}, {4093, 3}})
      ASSERT_NO_FATAL_FAILURE(transfer(*p->a, p->ra, *p->b, p->rb, &seq, n, so, dso));
  // And the other way, on the same path (sequence numbers are per direction).
  uint64_t back = 0;
  ASSERT_NO_FATAL_FAILURE(transfer(*p->b, p->rb, *p->a, p->ra, &back, (3 << 20) + 1, 5, 1));
  PathStats sa = p->a->stats(), sb = p->b->stats();
  EXPECT_EQ(sa.chunks_sent, seq);
  EXPECT_EQ(sb.chunks_received, seq);
  EXPECT_EQ(sb.chunks_sent, back);
  EXPECT_GT(sa.bytes_sent, uint64_t(64 << 20));
  EXPECT_GT(sa.host_copies, 0u);
  EXPECT_EQ(sa.device_copies, 0u);
  EXPECT_TRUE(p->ra.failed().empty());
  EXPECT_TRUE(p->rb.failed().empty());
}

// With a copy crew on each side (its own size each): the description says it, and the bytes of
// chunks larger than two of its pieces arrive exact both ways.
TEST(ShmPath, CopyCrewsShowInTheDescriptionAndMoveExactBytes) {
  auto p = make_paths(config("4", "4M"), std::make_shared<CopyCrew>(3), std::make_shared<CopyCrew>(2));
  ASSERT_TRUE(p->ok());
  EXPECT_EQ(p->a->describe(), "shm 4 x 4 MiB slots, 3 copy threads");
  EXPECT_EQ(p->b->describe(), "shm 4 x 4 MiB slots, 2 copy threads");
  uint64_t seq = 0, back = 0;
  for (size_t n : {size_t(1 << 20) + 3, size_t(kShmMaxChunk), size_t(32 << 20) + 5})
    ASSERT_NO_FATAL_FAILURE(transfer(*p->a, p->ra, *p->b, p->rb, &seq, n, 5, 3));
  ASSERT_NO_FATAL_FAILURE(transfer(*p->b, p->rb, *p->a, p->ra, &back, (9 << 20) + 1, 1, 7));
  EXPECT_TRUE(p->ra.failed().empty());
  EXPECT_TRUE(p->rb.failed().empty());
}

// Both sides send and receive many chunks at once with the same sequence numbers in both
// directions; the receivers post in an order of their own (all before or while the data flows).
TEST(ShmPath, ManyChunksInFlightBothDirections) {
  auto p = make_paths(config("8", "64K"));
  ASSERT_TRUE(p->ok());
  constexpr int kChunks = 96;
  struct Side {
    std::vector<std::vector<unsigned char>> out, in;
    std::vector<std::vector<unsigned char>> descs;
  };
  Side sa, sb;
  std::mt19937 rng(7);
  auto prepare = [&](Side& s) {
    for (int i = 0; i < kChunks; ++i) {
      size_t n = (rng() % 3 == 0) ? rng() % 100 : rng() % (1 << 20);
      s.out.emplace_back(n + 1);
      fill_random(s.out.back().data(), n + 1);
    }
  };
  prepare(sa);
  prepare(sb);
  for (int i = 0; i < kChunks; ++i) {  // each side receives the other's chunk i, at offset 1
    sa.in.emplace_back(sb.out[i].size());
    sb.in.emplace_back(sa.out[i].size());
  }
  auto send_all = [](PayloadPath& path, Side& s) {
    for (int i = 0; i < kChunks; ++i) {
      auto d = path.post_tx(i, {s.out[i].data() + 1, s.out[i].size() - 1, {}}, true);
      if (!d.ok()) return d.status();
      s.descs.push_back(std::move(*d));
    }
    return Status();
  };
  // Receivers post from other threads, in reverse order, once the "headers" (descriptors) exist.
  auto recv_all = [](PayloadPath& path, Side& from, Side& into) {
    for (int i = kChunks - 1; i >= 0; --i) {
      auto n = path.chunk_length(from.descs[i]);
      if (!n.ok()) return n.status();
      DMX_RETURN_IF_ERROR(path.post_rx(i, from.descs[i], {into.in[i].data() + 1, *n, {}}));
    }
    return Status();
  };
  auto ta = std::async(std::launch::async, [&] { return send_all(*p->a, sa); });
  auto tb = std::async(std::launch::async, [&] { return send_all(*p->b, sb); });
  ASSERT_TRUE(ta.get().ok());
  ASSERT_TRUE(tb.get().ok());
  auto rb = std::async(std::launch::async, [&] { return recv_all(*p->b, sa, sb); });
  auto ra = std::async(std::launch::async, [&] { return recv_all(*p->a, sb, sa); });
  ASSERT_TRUE(rb.get().ok());
  ASSERT_TRUE(ra.get().ok());
  for (int i = 0; i < kChunks; ++i) {
    for (Recorder* r : {&p->ra, &p->rb}) {
      Status s = r->wait(true, i);
      ASSERT_TRUE(s.ok()) << s.to_string();
      s = r->wait(false, i);
      ASSERT_TRUE(s.ok()) << s.to_string();
    }
    size_t na = sa.out[i].size() - 1, nb = sb.out[i].size() - 1;
    ASSERT_EQ(std::memcmp(sb.in[i].data() + 1, sa.out[i].data() + 1, na), 0) << "a->b chunk " << i;
    ASSERT_EQ(std::memcmp(sa.in[i].data() + 1, sb.out[i].data() + 1, nb), 0) << "b->a chunk " << i;
  }
}

// A chunk received into nothing (a cancelled transfer) is consumed from the ring; the chunks
// after it arrive intact. Discards of 0 B and of more than the whole ring.
TEST(ShmPath, DiscardedChunkThenNormalChunk) {
  auto p = make_paths(config("4", "4K"));
  ASSERT_TRUE(p->ok());
  std::vector<unsigned char> dropped(3 * 4096 * 4 + 17), kept(100000), empty, into(kept.size());
  fill_random(dropped.data(), dropped.size());
  fill_random(kept.data(), kept.size());
  fill_random(into.data(), into.size());
  auto d0 = p->a->post_tx(0, {dropped.data(), dropped.size(), {}}, true);
  auto d1 = p->a->post_tx(1, {empty.data(), 0, {}}, true);
  auto d2 = p->a->post_tx(2, {kept.data(), kept.size(), {}}, true);
  ASSERT_TRUE(d0.ok() && d1.ok() && d2.ok());
  ASSERT_TRUE(p->b->post_rx(0, *d0, {nullptr, dropped.size(), {}}).ok());
  ASSERT_TRUE(p->b->post_rx(1, *d1, {nullptr, 0, {}}).ok());
  ASSERT_TRUE(p->b->post_rx(2, *d2, {into.data(), into.size(), {}}).ok());
  for (uint64_t s = 0; s < 3; ++s) {
    Status st = p->ra.wait(true, s);
    EXPECT_TRUE(st.ok()) << st.to_string();
    st = p->rb.wait(false, s);
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  EXPECT_EQ(std::memcmp(into.data(), kept.data(), kept.size()), 0);
  EXPECT_TRUE(p->rb.failed().empty());
  // The discard copied nothing: only the kept chunk's slots were copied out on the receiver.
  EXPECT_EQ(p->b->stats().host_copies, (kept.size() + 4095) / 4096);
}

TEST(ShmPath, MalformedDescriptorsAreProtocolErrors) {
  auto p = make_paths();
  ASSERT_TRUE(p->ok());
  std::vector<unsigned char> buf(16);
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(9), size_t(16), kMaxPathDescriptor}) {
    std::vector<unsigned char> d(n, 0x01);
    EXPECT_EQ(p->b->chunk_length(d).status().code(), Code::kProtocol) << n << " B";
    EXPECT_EQ(p->b->post_rx(0, d, {buf.data(), 1, {}}).code(), Code::kProtocol) << n << " B";
  }
  for (uint64_t len : {kShmMaxChunk + 1, uint64_t(1) << 40, ~uint64_t(0)}) {
    std::vector<unsigned char> d(8);
    for (int i = 0; i < 8; ++i) d[i] = static_cast<unsigned char>(len >> (8 * i));
    Status s = p->b->chunk_length(d).status();
    EXPECT_EQ(s.code(), Code::kProtocol) << len;
    EXPECT_NE(s.message().find("announced a chunk"), std::string::npos) << s.to_string();
    EXPECT_EQ(p->b->post_rx(0, d, {nullptr, 0, {}}).code(), Code::kProtocol);
  }
  // A destination that does not match the descriptor is the caller's mistake.
  std::vector<unsigned char> d8 = {16, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(p->b->post_rx(0, d8, {buf.data(), 15, {}}).code(), Code::kInvalidArgument);
  // None of that broke the path.
  uint64_t seq = 0;
  ASSERT_NO_FATAL_FAILURE(transfer(*p->a, p->ra, *p->b, p->rb, &seq, 12345, 1, 2));
  EXPECT_TRUE(p->rb.failed().empty());
}

// The peer's chunk is longer or shorter than the descriptor the receiver was given: the peer is
// broken; the receiving path fails with kProtocol, normal receive or discard alike.
TEST(ShmPath, ChunkLengthDisagreeingWithItsDescriptorFailsThePath) {
  for (bool discard : {false, true}) {
    for (size_t announced : {size_t(1000), size_t(3000)}) {
      auto p = make_paths(config("4", "4K"));
      ASSERT_TRUE(p->ok());
      std::vector<unsigned char> src(2000), dst(announced);
      fill_random(src.data(), src.size());
      ASSERT_TRUE(p->a->post_tx(0, {src.data(), src.size(), {}}, true).ok());
      std::vector<unsigned char> lie(8);
      for (int i = 0; i < 8; ++i) lie[i] = static_cast<unsigned char>(uint64_t(announced) >> (8 * i));
      MemRegion r = discard ? MemRegion{nullptr, announced, {}} : MemRegion{dst.data(), announced, {}};
      ASSERT_TRUE(p->b->post_rx(0, lie, r).ok());
      Status s = p->rb.wait(false, 0);
      EXPECT_EQ(s.code(), Code::kProtocol) << s.to_string();
      ASSERT_TRUE(p->rb.wait_failed());
      EXPECT_EQ(p->rb.failed()[0].code(), Code::kProtocol);
      EXPECT_TRUE(p->rb.wait_stopped());
      // The sender learns it from the hang-up of the failed side.
      ASSERT_TRUE(p->ra.wait_failed());
      EXPECT_EQ(p->ra.failed()[0].code(), Code::kPeerFailed) << p->ra.failed()[0].to_string();
      EXPECT_TRUE(p->ra.wait_stopped());
    }
  }
}

// Indicative only (not run by default): throughput of 256 MiB cut into chunks of several sizes,
// all posted at once, as the engine would. Run with --gtest_also_run_disabled_tests.
TEST(ShmPath, DISABLED_ThroughputByChunkSize) {
  auto p = make_paths();
  ASSERT_TRUE(p->ok());
  const size_t total = 256u << 20;
  std::vector<unsigned char> src(total), dst(total);
  fill_random(src.data(), total);
  uint64_t seq = 0;
  for (int rep = 0; rep < 2; ++rep) {
    for (size_t chunk : {size_t(256) << 10, size_t(1) << 20, size_t(kShmMaxChunk)}) {
      uint64_t first = seq;
      auto t0 = Clock::now();
      for (size_t off = 0; off < total; off += chunk) {
        auto d = p->a->post_tx(seq, {src.data() + off, chunk, {}}, true);
        ASSERT_TRUE(d.ok());
        ASSERT_TRUE(p->b->post_rx(seq, *d, {dst.data() + off, chunk, {}}).ok());
        ++seq;
      }
      for (uint64_t s = first; s < seq; ++s) ASSERT_TRUE(p->rb.wait(false, s).ok());
      double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      std::printf("chunk %7zu KiB: %.2f GB/s\n", chunk >> 10, total / secs / 1e9);
    }
  }
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), total), 0);
}

}  // namespace
}  // namespace dmx
