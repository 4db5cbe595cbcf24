// One-sided operations by the devmem payload path through the engine, over the socket-pair double
// (see devmem_engine_test.cc): writes and reads by devmem, vectored writes and reads, a
// destination the gatherer cannot write (the landing zone, or inline). Helpers in
// devmem_engine_util.h.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "engine/devmem_engine_util.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;
using namespace devmem_engine;

// A one-sided write goes by devmem (not inline on the stream), lands with its notification, and
// a read comes back by devmem too.
TEST(DevmemEngineDouble, WriteAndReadByDevmem) {
  DevmemPair p = connect_devmem();
  size_t n = 5 * (1 << 20) + 1;
  Buffer target = poisoned(kSim, n + 100);
  auto reg = p.a.ctx.register_memory(target.region());
  ASSERT_TRUE(reg.ok()) << reg.status().to_string();
  Filled src = filled(kSim, n);
  uint64_t before = devmem_bytes_received(p.server);
  uint64_t stream_before = inline_bytes_received(p.server);
  OpOptions notify;
  notify.notify = true;
  notify.notify_value = 0xD1CE;
  Request w = p.client.write(src.buf.region(), reg->remote(), 33, notify);
  ASSERT_TRUE(w.wait(kEventually).ok()) << w.status().to_string();
  auto note = p.server.next_notification(10s);
  ASSERT_TRUE(note.ok()) << note.status().to_string();
  EXPECT_EQ(note->value, 0xD1CEu);
  EXPECT_EQ(note->length, n);
  auto got = read_back(target.region());
  ASSERT_TRUE(std::equal(src.data.begin(), src.data.end(), got.begin() + 33));
  EXPECT_EQ(got[32], 0xA5);
  EXPECT_EQ(got[33 + n], 0xA5);
  EXPECT_GE(devmem_bytes_received(p.server) - before, n) << "the write did not come by devmem";
  EXPECT_LT(inline_bytes_received(p.server) - stream_before, n / 2) << "the write's bytes came inline";

  Buffer back = poisoned(kSim, n + 7);
  uint64_t read_before = devmem_bytes_received(p.client);
  Request r = p.client.read(back.region().sub(7, n), reg->remote(), 33);
  ASSERT_TRUE(r.wait(kEventually).ok()) << r.status().to_string();
  auto again = read_back(back.region());
  ASSERT_TRUE(std::equal(src.data.begin(), src.data.end(), again.begin() + 7));
  EXPECT_GE(devmem_bytes_received(p.client) - read_before, n) << "the read did not come by devmem";
}

// Writes `entries` from `src` into the two regions d0 and d1 (registered at the server) with a
// notification, and checks it: the notified length, every byte of both regions (poison around the
// entries). Returns the bytes written.
uint64_t write_vec_and_check(DevmemPair& p, const Filled& src, const Buffer& d0, const Buffer& d1,
                             const RemoteRegion (&remote)[2], const std::vector<IoEntry>& entries) {
  MemRegion local[] = {src.buf.region()};
  uint64_t total = 0;
  for (const auto& e : entries) total += e.length;
  OpOptions notify;
  notify.notify = true;
  notify.notify_value = 0x5EC;
  Request w = p.client.write_vec(local, remote, entries, notify);
  EXPECT_TRUE(w.wait(kEventually).ok()) << w.status().to_string();
  auto note = p.server.next_notification(10s);
  EXPECT_TRUE(note.ok()) << note.status().to_string();
  if (!note.ok()) return total;
  EXPECT_EQ(note->value, 0x5ECu);
  EXPECT_EQ(note->length, total);
  std::vector<std::vector<unsigned char>> want = {std::vector<unsigned char>(d0.size(), 0xA5),
                                                  std::vector<unsigned char>(d1.size(), 0xA5)};
  for (const auto& e : entries)
    std::copy_n(src.data.begin() + static_cast<std::ptrdiff_t>(e.local_offset), e.length,
                want[e.remote].begin() + static_cast<std::ptrdiff_t>(e.remote_offset));
  EXPECT_TRUE(read_back(d0.region()) == want[0]) << "remote region 0 differs";
  EXPECT_TRUE(read_back(d1.region()) == want[1]) << "remote region 1 differs";
  return total;
}

// A vectored write's segments go by devmem like a plain write's (the Transfer gets the paths that
// land writes), not inline on the stream: scattered multi-MiB segments into two registered
// regions, byte exact, with one notification.
TEST(DevmemEngineDouble, WriteVecByDevmem) {
  DevmemPair p = connect_devmem();
  constexpr uint64_t kSeg = (1u << 20) + 37;
  Filled src = filled(kSim, 6 * kSeg);
  Buffer d0 = poisoned(kSim, 4 * kSeg), d1 = poisoned(kSim, 4 * kSeg);
  auto r0 = p.a.ctx.register_memory(d0.region());
  auto r1 = p.a.ctx.register_memory(d1.region());
  ASSERT_TRUE(r0.ok() && r1.ok());
  RemoteRegion remote[] = {r0->remote(), r1->remote()};
  // Six segments, none adjacent to the next on both sides (no merging into one plain write).
  std::vector<IoEntry> entries;
  for (uint64_t i = 0; i < 6; ++i)
    entries.push_back(IoEntry{0, static_cast<uint32_t>(i % 2), (5 - i) * kSeg, (i / 2) * kSeg + (i % 3), kSeg - 3});
  uint64_t before = devmem_bytes_received(p.server);
  uint64_t stream_before = inline_bytes_received(p.server);
  uint64_t total = write_vec_and_check(p, src, d0, d1, remote, entries);
  EXPECT_GE(devmem_bytes_received(p.server) - before, total) << "the vectored write did not come by devmem";
  EXPECT_LT(inline_bytes_received(p.server) - stream_before, total / 2) << "the vectored write's bytes came inline";
}

// A KV-cache shaped write (3,000 blocks of 4 KiB and a few odd ones, scattered over two regions)
// goes by devmem as table chunks: a few lists of up to 1,024 pieces, not a chunk per block.
TEST(DevmemEngineDouble, WriteVecOfSmallBlocksGoesAsLists) {
  DevmemPair p = connect_devmem();
  constexpr uint64_t kBlocks = 3000, kS = 4096;
  Filled src = filled(kSim, (kBlocks + 2) * kS);
  Buffer d0 = poisoned(kSim, kBlocks * kS), d1 = poisoned(kSim, kBlocks * kS);
  auto r0 = p.a.ctx.register_memory(d0.region());
  auto r1 = p.a.ctx.register_memory(d1.region());
  ASSERT_TRUE(r0.ok() && r1.ok());
  RemoteRegion remote[] = {r0->remote(), r1->remote()};
  std::vector<IoEntry> entries;
  for (uint64_t i = 0; i < kBlocks; ++i) {  // block i from slot i + 1, to the other end of a region
    uint64_t len = i % 500 == 7 ? kS - 1 - i % 3 : kS;
    entries.push_back(IoEntry{0, static_cast<uint32_t>(i % 2), (i + 1) * kS + i % 5, (kBlocks - 1 - i) * kS, len});
  }
  uint64_t chunks_before = devmem_chunks_received(p.server), bytes_before = devmem_bytes_received(p.server);
  uint64_t total = write_vec_and_check(p, src, d0, d1, remote, entries);
  EXPECT_EQ(devmem_bytes_received(p.server) - bytes_before, total) << "not every block came by devmem";
  uint64_t got = devmem_chunks_received(p.server) - chunks_before;
  EXPECT_GE(got, 3u);
  EXPECT_LE(got, 8u) << "the blocks went chunk by chunk, not as lists";
}

// The same blocks read back: the target serves them by devmem as READ_DATA table chunks.
TEST(DevmemEngineDouble, ReadVecOfSmallBlocksComesAsLists) {
  DevmemPair p = connect_devmem();
  constexpr uint64_t kBlocks = 3000, kS = 4096;
  Filled s0 = filled(kSim, kBlocks * kS), s1 = filled(kSim, kBlocks * kS);
  auto r0 = p.a.ctx.register_memory(s0.buf.region());
  auto r1 = p.a.ctx.register_memory(s1.buf.region());
  ASSERT_TRUE(r0.ok() && r1.ok());
  RemoteRegion remote[] = {r0->remote(), r1->remote()};
  Buffer dst = poisoned(kSim, (kBlocks + 2) * kS);
  std::vector<unsigned char> want(dst.size(), 0xA5);
  std::vector<IoEntry> entries;
  uint64_t total = 0;
  for (uint64_t i = 0; i < kBlocks; ++i) {  // block i into slot i + 1 (never past it), from the other end
    uint64_t len = (i % 500 == 7 ? kS - 1 - i % 3 : kS) - 4, at = (i + 1) * kS + i % 5, from = (kBlocks - 1 - i) * kS;
    const Filled& src = i % 2 == 0 ? s0 : s1;
    entries.push_back(IoEntry{0, static_cast<uint32_t>(i % 2), at, from, len});
    std::copy_n(src.data.begin() + static_cast<std::ptrdiff_t>(from), len, want.begin() + static_cast<std::ptrdiff_t>(at));
    total += len;
  }
  uint64_t chunks_before = devmem_chunks_received(p.client), bytes_before = devmem_bytes_received(p.client);
  MemRegion local[] = {dst.region()};
  Request r = p.client.read_vec(local, remote, entries);
  ASSERT_TRUE(r.wait(kEventually).ok()) << r.status().to_string();
  EXPECT_EQ(r.bytes(), total);
  EXPECT_TRUE(read_back(dst.region()) == want) << "the blocks landed wrong";
  EXPECT_EQ(devmem_bytes_received(p.client) - bytes_before, total) << "not every block came by devmem";
  uint64_t got = devmem_chunks_received(p.client) - chunks_before;
  EXPECT_GE(got, 3u);
  EXPECT_LE(got, 8u) << "the blocks came chunk by chunk, not as lists";
}

// A gatherer that writes host memory only (as a GPU pool's writes only its device's): a write into
// a sim region still goes by devmem, lands in the landing zone and is copied on; a write into a
// host region is gathered straight into it. Sends and reads into sim buffers stay inline.
TEST(DevmemEngineDouble, WriteIntoMemoryTheGathererCannotWriteLandsInTheLandingZone) {
  SimNicOptions no;
  no.gather_host_only = true;
  DevmemPair p = connect_devmem(Wrap::kNone, devmem_options(), no);
  ASSERT_TRUE(p.client.valid() && p.server.valid());
  for (size_t n : {size_t{1}, size_t{4097}, (size_t{40} << 20) + 3}) {  // 40 MiB: three chunks, one zone
    SCOPED_TRACE(n);
    Buffer target = poisoned(kSim, n + 20);
    auto reg = p.a.ctx.register_memory(target.region());
    ASSERT_TRUE(reg.ok()) << reg.status().to_string();
    Filled src = filled(kSim, n);
    uint64_t before = devmem_bytes_received(p.server);
    OpOptions notify;
    notify.notify = true;
    notify.notify_value = n;
    Request w = p.client.write(src.buf.region(), reg->remote(), 11, notify);
    ASSERT_TRUE(w.wait(kEventually).ok()) << w.status().to_string();
    auto note = p.server.next_notification(10s);
    ASSERT_TRUE(note.ok()) << note.status().to_string();
    EXPECT_EQ(note->value, n);
    auto got = read_back(target.region());
    ASSERT_TRUE(std::equal(src.data.begin(), src.data.end(), got.begin() + 11));
    EXPECT_EQ(got[10], 0xA5);
    EXPECT_EQ(got[11 + n], 0xA5);
    EXPECT_GE(devmem_bytes_received(p.server) - before, n) << "the write did not come by devmem";
  }
  std::string detail = devmem_detail(p.server);
  EXPECT_NE(detail.find("landing zone a buffer in"), std::string::npos) << detail;
  // Host memory is gathered into directly (no landing), and a host source is not devmem's.
  size_t n = (3u << 20) + 5;
  Buffer host_target = poisoned(kHost, n);
  auto reg = p.a.ctx.register_memory(host_target.region());
  ASSERT_TRUE(reg.ok());
  Filled src = filled(kSim, n);
  uint64_t before = devmem_bytes_received(p.server);
  ASSERT_TRUE(p.client.write(src.buf.region(), reg->remote(), 0).wait(kEventually).ok());
  EXPECT_EQ(read_back(host_target.region()), src.data);
  EXPECT_GE(devmem_bytes_received(p.server) - before, n);
  // A send into a sim buffer: the receiver does not name devmem for it, so it goes inline.
  Buffer sim_dst = poisoned(kSim, n);
  uint64_t sent = devmem_bytes_sent(p.client);
  Request r = p.server.recv(sim_dst.region(), 3);
  ASSERT_TRUE(p.client.send(src.buf.region(), 3).wait(kEventually).ok());
  ASSERT_TRUE(r.wait(kEventually).ok()) << r.status().to_string();
  EXPECT_EQ(read_back(sim_dst.region()), src.data);
  EXPECT_EQ(devmem_bytes_sent(p.client), sent);
}

TEST(DevmemEngineDouble, DestinationTheGathererCannotWriteGoesInline) {
  DevmemPair p = connect_devmem(Wrap::kSimOnly);
  size_t n = (3u << 20) + 7;
  Filled src = filled(kSim, n);
  Buffer host_dst = poisoned(kHost, n);
  uint64_t before = devmem_bytes_sent(p.client);
  Request r = p.server.recv(host_dst.region(), 1);
  ASSERT_TRUE(p.client.send(src.buf.region(), 1).wait(kEventually).ok());
  ASSERT_TRUE(r.wait(kEventually).ok()) << r.status().to_string();
  EXPECT_EQ(read_back(host_dst.region()), src.data);
  EXPECT_EQ(devmem_bytes_sent(p.client), before) << "a buffer that does not accept devmem got devmem chunks";

  Buffer sim_dst = poisoned(kSim, n);
  Request r2 = p.server.recv(sim_dst.region(), 2);
  ASSERT_TRUE(p.client.send(src.buf.region(), 2).wait(kEventually).ok());
  ASSERT_TRUE(r2.wait(kEventually).ok()) << r2.status().to_string();
  EXPECT_EQ(read_back(sim_dst.region()), src.data);
  EXPECT_GE(devmem_bytes_sent(p.client) - before, n);

  // A read into host memory: the reader's READ_REQ does not flag devmem either.
  auto reg = p.a.ctx.register_memory(sim_dst.region());
  ASSERT_TRUE(reg.ok());
  Buffer back = poisoned(kHost, n);
  uint64_t rb = devmem_bytes_received(p.client);
  ASSERT_TRUE(p.client.read(back.region(), reg->remote(), 0).wait(kEventually).ok());
  EXPECT_EQ(read_back(back.region()), src.data);
  EXPECT_EQ(devmem_bytes_received(p.client), rb);
}

}  // namespace
}  // namespace dmx::test
