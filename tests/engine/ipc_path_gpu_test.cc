// Tests of the cuda_ipc payload path on real GPUs (CudaIpcPathGpu.*): two processes. CUDA cannot be
// used in a child forked after the parent initialised it, so (as in
// tests/transport/cuda_ipc_gpu_test.cc) the probe and both peers run in forked children; skipped
// with the reason when there is no usable GPU. The CUDA-free tests are in ipc_path_test.cc.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>

#include "transport/cuda_ipc/ipc_path.h"
#include "memory/backend.h"
#include "engine/ipc_path_test_util.h"
#include "transport/gpu_children.h"
#include "transport/transport_test_util.h"

namespace dmx {
namespace {

using cuda_ipc::IpcDescriptor;
using testing::Recorder;
using testing::config;
using testing::probe_gpus;
using testing::secs;
using namespace std::chrono_literals;

#define REQUIRE_GPUS(n_var)                                       \
  std::string why;                                                \
  int n_var = probe_gpus(&why);                                   \
  if (n_var < 1) DMX_SKIP(::dmx::test::kNoGpu) << why

// Runs `a` and `b` in two forked children joined by a Unix socket pair; their exit codes.
void run_pair(const std::function<int(UnixChannel)>& a, const std::function<int(UnixChannel)>& b, int* ra, int* rb) {
  auto p = UnixChannel::pair();
  ASSERT_TRUE(p.ok());
  pid_t ca = testing::fork_child([&] {
    { UnixChannel drop = std::move(p->second); }
    return a(std::move(p->first));
  });
  pid_t cb = testing::fork_child([&] {
    { UnixChannel drop = std::move(p->first); }
    return b(std::move(p->second));
  });
  { UnixChannel d1 = std::move(p->first), d2 = std::move(p->second); }
  *rb = testing::wait_child(cb, std::chrono::seconds(200));
  *ra = testing::wait_child(ca, std::chrono::seconds(30));
}

// What the sender tells the receiver about one chunk, followed by the path's descriptor bytes.
struct ChunkNote {
  uint32_t transfer = 0;  // index into the plan
  uint32_t dst_kind = 0;  // index into kDstKinds
  uint64_t offset = 0;    // of the chunk inside its transfer
  uint64_t seed = 0;      // of the data: byte i of the source allocation is pattern_byte(seed, i)
  uint64_t src_offset = 0;  // of the chunk inside the source allocation
};

std::vector<std::byte> note_message(const ChunkNote& n, std::span<const unsigned char> desc) {
  std::vector<std::byte> m(sizeof n + desc.size());
  std::memcpy(m.data(), &n, sizeof n);
  std::memcpy(m.data() + sizeof n, desc.data(), desc.size());
  return m;
}

bool parse_note(const std::vector<std::byte>& m, ChunkNote* n, std::span<const unsigned char>* desc) {
  if (m.size() < sizeof *n) return false;
  std::memcpy(n, m.data(), sizeof *n);
  *desc = {reinterpret_cast<const unsigned char*>(m.data()) + sizeof *n, m.size() - sizeof *n};
  return true;
}

std::vector<std::byte> word(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size()};
}
bool is_word(const std::vector<std::byte>& m, std::string_view s) {
  return m.size() == s.size() && std::memcmp(m.data(), s.data(), s.size()) == 0;
}

uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) | rd();
}

// Source (one allocation; transfers at odd offsets) and destination layout, the same in both
// children.
struct Transfer {
  size_t size, src_offset, dst_offset;
};
constexpr MemKind kDstKinds[] = {MemKind::kCuda, MemKind::kHost, MemKind::kPinned};
std::vector<Transfer> plan(size_t* src_total, size_t* dst_total) {
  std::vector<Transfer> t;
  size_t src = 4097, dst = 7;
  for (size_t size : {size_t(1), size_t(4097), size_t((1 << 20) + 3), size_t((64 << 20) + 3)}) {
    t.push_back({size, src, dst});
    src += size + 13;
    dst += size + 5;
  }
  *src_total = src + 11;
  *dst_total = dst + 9;
  return t;
}

Status host_to(const MemRegion& dst, const void* src) {
  return copy_memory(dst, {const_cast<void*>(src), dst.size, {}});
}

// Sender: fills the source with fresh random data, cuts every transfer into max_chunk() pieces,
// exports them all (once per destination kind) and sends the notes; waits for "done".
int deliver_sender(UnixChannel ch, int device) {
  Recorder rec;  // outlives the path, which reports to it until stopped
  auto path = make_cuda_ipc_path(config(), ch.peer_name());
  CHILD_CHECK(path.ok(), 10);
  (*path)->start(&rec, nullptr);
  size_t src_total = 0, dst_total = 0;
  auto transfers = plan(&src_total, &dst_total);
  auto src = Buffer::allocate({MemKind::kCuda, device}, src_total);
  CHILD_CHECK(src.ok(), 11);
  uint64_t seed = fresh_seed();
  std::vector<uint8_t> host(src_total);
  testing::fill_pattern(host.data(), host.size(), seed);
  CHILD_CHECK(host_to(src->region(), host.data()).ok(), 12);
  uint64_t seq = 0, max = (*path)->max_chunk();
  for (uint32_t k = 0; k < std::size(kDstKinds); ++k)
    for (uint32_t i = 0; i < transfers.size(); ++i)
      for (uint64_t off = 0; off < transfers[i].size; off += max) {
        size_t n = std::min<uint64_t>(max, transfers[i].size - off);
        size_t at = transfers[i].src_offset + off;
        auto desc = (*path)->post_tx(seq++, src->region().sub(at, n), true);
        CHILD_CHECK(desc.ok(), 13);
        CHILD_CHECK(desc->size() <= kMaxPathDescriptor, 14);
        CHILD_CHECK(ch.send(note_message({i, k, off, seed, at}, *desc), {}, secs(10)).ok(), 15);
      }
  CHILD_CHECK(ch.send(word("end"), {}, secs(10)).ok(), 16);
  std::vector<std::byte> msg;
  CHILD_CHECK(ch.recv(&msg, 0, nullptr, secs(150)).ok() && is_word(msg, "done"), 17);  // src in use until then
  PathStats s = (*path)->stats();
  CHILD_CHECK(s.chunks_sent == seq, 18);
  (*path)->stop();
  CHILD_CHECK(rec.tx_done == 0, 19);
  return 0;
}

// Receiver: posts every chunk as it arrives (all in flight together), waits for all, then checks
// every destination byte: the source's bytes inside transfers, the guard value outside.
int deliver_receiver(UnixChannel ch, int device) {
  Recorder rec;  // outlives the path, which reports to it until stopped
  auto path = make_cuda_ipc_path(config(), ch.peer_name());
  CHILD_CHECK(path.ok(), 30);
  (*path)->start(&rec, nullptr);
  size_t src_total = 0, dst_total = 0;
  auto transfers = plan(&src_total, &dst_total);
  std::vector<Buffer> dst;
  std::vector<uint8_t> guard(dst_total, 0xEE);
  for (MemKind k : kDstKinds) {
    auto b = Buffer::allocate({k, k == MemKind::kCuda ? device : 0}, dst_total);
    CHILD_CHECK(b.ok(), 31);
    CHILD_CHECK(host_to(b->region(), guard.data()).ok(), 32);
    dst.push_back(std::move(*b));
  }
  uint64_t seq = 0, seed = 0;
  for (;;) {
    std::vector<std::byte> msg;
    CHILD_CHECK(ch.recv(&msg, 0, nullptr, secs(60)).ok(), 33);
    if (is_word(msg, "end")) break;
    ChunkNote note;
    std::span<const unsigned char> desc;
    CHILD_CHECK(parse_note(msg, &note, &desc), 34);
    seed = note.seed;
    auto len = (*path)->chunk_length(desc);
    CHILD_CHECK(len.ok() && note.transfer < transfers.size() && note.dst_kind < dst.size(), 35);
    const Transfer& t = transfers[note.transfer];
    CHILD_CHECK(*len <= (*path)->max_chunk() && note.offset + *len <= t.size, 36);
    MemRegion where = dst[note.dst_kind].region().sub(t.dst_offset + note.offset, *len);
    Status s = (*path)->post_rx(seq++, desc, where);
    if (!s.ok()) fprintf(stderr, "post_rx: %s\n", s.to_string().c_str());
    CHILD_CHECK(s.ok(), 37);
  }
  CHILD_CHECK(rec.wait_rx(seq, 60s), 38);
  {
    std::lock_guard lock(rec.mu_);
    for (uint64_t i = 0; i < seq; ++i) {
      if (!rec.rx[i].ok()) fprintf(stderr, "chunk %llu: %s\n", (unsigned long long)i, rec.rx[i].to_string().c_str());
      CHILD_CHECK(rec.rx_count[i] == 1 && rec.rx[i].ok(), 39);
    }
    CHILD_CHECK(rec.failed == 0, 40);
  }
  fprintf(stderr, "receiver: %s\n", (*path)->describe().c_str());
  PathStats s = (*path)->stats();
  CHILD_CHECK(s.device_copies == seq && s.chunks_received == seq, 41);
  CHILD_CHECK(ch.send(word("done"), {}, secs(10)).ok(), 42);
  std::vector<uint8_t> back(dst_total);
  for (size_t k = 0; k < dst.size(); ++k) {
    CHILD_CHECK(copy_memory({back.data(), back.size(), {}}, dst[k].region()).ok(), 43);
    size_t at = 0;
    for (const Transfer& t : transfers) {
      for (; at < t.dst_offset; ++at) CHILD_CHECK(back[at] == 0xEE, 44);
      for (size_t i = 0; i < t.size; ++i, ++at)
        if (back[at] != testing::pattern_byte(seed, t.src_offset + i)) {
          fprintf(stderr, "dst kind %zu transfer of %zu B: byte %zu differs\n", k, t.size, i);
          return 45;
        }
    }
    for (; at < dst_total; ++at) CHILD_CHECK(back[at] == 0xEE, 46);
  }
  auto t0 = Clock::now();
  (*path)->stop();
  CHILD_CHECK(Clock::now() - t0 < 5s && rec.stopped == 1, 47);
  return 0;
}

TEST(CudaIpcPathGpu, DeliversByteExactToCudaHostAndPinned) {
  REQUIRE_GPUS(n);
  int src_dev = n >= 2 ? 1 : 0;  // two GPUs: across the peer link; one: two processes share it
  int ra = -1, rb = -1;
  run_pair([&](UnixChannel c) { return deliver_sender(std::move(c), src_dev); },
           [&](UnixChannel c) { return deliver_receiver(std::move(c), 0); }, &ra, &rb);
  EXPECT_EQ(rb, 0);
  EXPECT_EQ(ra, 0);
}

TEST(CudaIpcPathGpu, DeliversWithinOneGpu) {
  REQUIRE_GPUS(n);
  int ra = -1, rb = -1;
  run_pair([&](UnixChannel c) { return deliver_sender(std::move(c), 0); },
           [&](UnixChannel c) { return deliver_receiver(std::move(c), 0); }, &ra, &rb);
  EXPECT_EQ(rb, 0);
  EXPECT_EQ(ra, 0);
}

// The sender frees its buffer and allocates one of the same size, which cudaMalloc puts at the same
// address: the next export must carry the new allocation's handle (a stale cached one would make
// the receiver read the old, freed memory: the old data), and retire the old id.
constexpr size_t kStaleAlloc = (4 << 20) + 1;
constexpr size_t kStaleOffset = 3, kStaleLen = (1 << 20) + 5;

int stale_sender(UnixChannel ch, int device) {
  auto path = make_cuda_ipc_path(config(), ch.peer_name());
  CHILD_CHECK(path.ok(), 10);
  std::vector<uint8_t> host(kStaleAlloc);
  std::vector<std::byte> msg;
  IpcChunkDescriptor first;
  void* first_ptr = nullptr;
  bool reused = false;
  for (uint64_t round = 0; round < 3; ++round) {
    auto buf = Buffer::allocate({MemKind::kCuda, device}, kStaleAlloc);
    CHILD_CHECK(buf.ok(), 11);
    uint64_t seed = fresh_seed();
    testing::fill_pattern(host.data(), host.size(), seed);
    CHILD_CHECK(host_to(buf->region(), host.data()).ok(), 12);
    // Rounds 1 and 2 export twice: the second export of the same allocation hits the cache.
    for (int twice = 0; twice < (round == 0 ? 1 : 2); ++twice) {
      auto desc = (*path)->post_tx(round * 2 + twice, buf->region().sub(kStaleOffset, kStaleLen), true);
      CHILD_CHECK(desc.ok(), 13);
      auto d = IpcChunkDescriptor::decode(*desc);
      CHILD_CHECK(d.ok(), 14);
      if (round == 0) {
        first = *d;
        first_ptr = buf->data();
      } else if (buf->data() == first_ptr && twice == 0 && round == 1) {
        reused = true;
        CHILD_CHECK(d->source.alloc_id != first.source.alloc_id, 15);
        CHILD_CHECK(d->source.handle != first.source.handle, 16);
        CHILD_CHECK(d->retired.size() == 1 && d->retired[0] == first.source.alloc_id, 17);
      }
      CHILD_CHECK(ch.send(note_message({0, 0, 0, seed, kStaleOffset}, *desc), {}, secs(10)).ok(), 18);
      CHILD_CHECK(ch.recv(&msg, 0, nullptr, secs(60)).ok() && is_word(msg, "ok"), 19);
    }
    // `buf` is freed here, while the receiver still has it mapped (as a user would).
  }
  CHILD_CHECK(ch.send(word("end"), {}, secs(10)).ok(), 20);
  fprintf(stderr, "stale sender: the freed buffer's address %s\n", reused ? "was reused" : "was NOT reused");
  return reused ? 0 : 3;  // 3: cudaMalloc did not give the same address; the case was not exercised
}

int stale_receiver(UnixChannel ch, int device) {
  Recorder rec;  // outlives the path, which reports to it until stopped
  auto path = make_cuda_ipc_path(config(), ch.peer_name());
  CHILD_CHECK(path.ok(), 30);
  (*path)->start(&rec, nullptr);
  auto dst = Buffer::allocate({MemKind::kCuda, device}, kStaleLen + 1);
  CHILD_CHECK(dst.ok(), 31);
  std::vector<uint8_t> back(kStaleLen);
  for (uint64_t seq = 0;; ++seq) {
    std::vector<std::byte> msg;
    CHILD_CHECK(ch.recv(&msg, 0, nullptr, secs(60)).ok(), 32);
    if (is_word(msg, "end")) break;
    ChunkNote note;
    std::span<const unsigned char> desc;
    CHILD_CHECK(parse_note(msg, &note, &desc), 33);
    CHILD_CHECK((*path)->post_rx(seq, desc, dst->region().sub(1, kStaleLen)).ok(), 34);
    CHILD_CHECK(rec.wait_rx(seq + 1, 30s), 35);
    {
      std::lock_guard lock(rec.mu_);
      if (!rec.rx[seq].ok()) fprintf(stderr, "chunk %llu: %s\n", (unsigned long long)seq, rec.rx[seq].to_string().c_str());
      CHILD_CHECK(rec.rx[seq].ok(), 36);
    }
    CHILD_CHECK(copy_memory({back.data(), back.size(), {}}, dst->region().sub(1, kStaleLen)).ok(), 37);
    for (size_t i = 0; i < kStaleLen; ++i)
      if (back[i] != testing::pattern_byte(note.seed, note.src_offset + i)) {
        fprintf(stderr, "chunk %llu: byte %zu is not this round's data (a stale mapping?)\n", (unsigned long long)seq, i);
        return 38;
      }
    CHILD_CHECK(ch.send(word("ok"), {}, secs(10)).ok(), 39);
  }
  (*path)->stop();
  return 0;
}

TEST(CudaIpcPathGpu, FreeAndReallocAtTheSameAddressSendsAFreshHandle) {
  REQUIRE_GPUS(n);
  int src_dev = n >= 2 ? 1 : 0;
  int ra = -1, rb = -1;
  run_pair([&](UnixChannel c) { return stale_sender(std::move(c), src_dev); },
           [&](UnixChannel c) { return stale_receiver(std::move(c), 0); }, &ra, &rb);
  EXPECT_EQ(rb, 0);
  if (ra == 3) DMX_SKIP(::dmx::test::kNotExercised) << "cudaMalloc did not return the freed address again";
  EXPECT_EQ(ra, 0);
}

// Sender side of the stop and kill tests: `chunks` chunks of max_chunk() from one allocation, then
// `late` more from a second allocation; then waits for "done" (or is killed).
int bulk_sender(UnixChannel ch, int device, int chunks, int late) {
  auto path = make_cuda_ipc_path(config(), ch.peer_name());
  CHILD_CHECK(path.ok(), 10);
  uint64_t max = (*path)->max_chunk();
  auto a = Buffer::allocate({MemKind::kCuda, device}, max * chunks);
  auto b = Buffer::allocate({MemKind::kCuda, device}, max * std::max(late, 1));
  CHILD_CHECK(a.ok() && b.ok(), 11);
  uint64_t seq = 0;
  for (int i = 0; i < chunks + late; ++i) {
    const Buffer& from = i < chunks ? *a : *b;
    size_t at = (i < chunks ? i : i - chunks) * max;
    auto desc = (*path)->post_tx(seq++, from.region().sub(at, max), true);
    CHILD_CHECK(desc.ok(), 12);
    CHILD_CHECK(ch.send(note_message({0, 0, 0, 0, at}, *desc), {}, secs(10)).ok(), 13);
  }
  std::vector<std::byte> msg;
  CHILD_CHECK(ch.recv(&msg, 0, nullptr, secs(120)).ok() && is_word(msg, "done"), 14);
  return 0;
}

TEST(CudaIpcPathGpu, StopWaitsForCopiesInFlight) {
  REQUIRE_GPUS(n);
  int src_dev = n >= 2 ? 1 : 0;
  constexpr int kChunks = 8;
  int ra = -1, rb = -1;
  auto receiver = [&](UnixChannel ch) {
    Recorder rec;  // outlives the path, which reports to it until stopped
    auto path = make_cuda_ipc_path(config(), ch.peer_name());
    CHILD_CHECK(path.ok(), 30);
    (*path)->start(&rec, nullptr);
    uint64_t max = (*path)->max_chunk();
    auto dst = Buffer::allocate({MemKind::kCuda, 0}, max * kChunks);
    CHILD_CHECK(dst.ok(), 31);
    std::vector<std::vector<std::byte>> msgs(kChunks);
    for (auto& m : msgs) CHILD_CHECK(ch.recv(&m, 0, nullptr, secs(60)).ok(), 32);
    for (int i = 0; i < kChunks; ++i) {
      ChunkNote note;
      std::span<const unsigned char> desc;
      CHILD_CHECK(parse_note(msgs[i], &note, &desc), 33);
      CHILD_CHECK((*path)->post_rx(i, desc, dst->region().sub(i * max, max)).ok(), 34);
    }
    auto t0 = Clock::now();
    (*path)->stop();  // at once: the copies are (mostly) in flight
    CHILD_CHECK(Clock::now() - t0 < 5s, 35);
    {
      std::lock_guard lock(rec.mu_);
      CHILD_CHECK(rec.stopped == 1, 36);
      CHILD_CHECK(rec.rx_total == size_t(kChunks) && rec.rx_after_stop == 0, 37);  // all reported, before stopped
      int copied = 0;
      for (int i = 0; i < kChunks; ++i) {
        CHILD_CHECK(rec.rx_count[i] == 1, 38);
        copied += rec.rx[i].ok();
        if (!rec.rx[i].ok()) CHILD_CHECK(rec.rx[i].code() == Code::kCancelled, 39);
      }
      fprintf(stderr, "stop: %d of %d chunks were copied, the others cancelled\n", copied, kChunks);
    }
    CHILD_CHECK(ch.send(word("done"), {}, secs(10)).ok(), 40);
    return 0;
  };
  run_pair([&](UnixChannel c) { return bulk_sender(std::move(c), src_dev, kChunks, 0); }, receiver, &ra, &rb);
  EXPECT_EQ(rb, 0);
  EXPECT_EQ(ra, 0);
}

TEST(CudaIpcPathGpu, PeerKilledMidTransferNeverHangs) {
  REQUIRE_GPUS(n);
  int src_dev = n >= 2 ? 1 : 0;
  constexpr int kChunks = 16, kLate = 4;
  int ra = -1, rb = -1;
  auto receiver = [&](UnixChannel ch) {
    Recorder rec;  // outlives the path, which reports to it until stopped
    auto path = make_cuda_ipc_path(config(), ch.peer_name());
    CHILD_CHECK(path.ok(), 30);
    (*path)->start(&rec, nullptr);
    uint64_t max = (*path)->max_chunk();
    auto dst = Buffer::allocate({MemKind::kCuda, 0}, max * (kChunks + kLate));
    CHILD_CHECK(dst.ok(), 31);
    std::vector<std::vector<std::byte>> msgs(kChunks + kLate);
    for (auto& m : msgs) CHILD_CHECK(ch.recv(&m, 0, nullptr, secs(60)).ok(), 32);
    int32_t owner = 0;
    for (int i = 0; i < kChunks + kLate; ++i) {
      ChunkNote note;
      std::span<const unsigned char> desc;
      CHILD_CHECK(parse_note(msgs[i], &note, &desc), 33);
      auto d = IpcChunkDescriptor::decode(desc);
      CHILD_CHECK(d.ok(), 34);
      owner = d->source.owner_pid;
      if (i == kChunks) {
        ::kill(owner, SIGKILL);  // dies with the first 16 copies in flight; the last 4 map a dead process
        std::this_thread::sleep_for(50ms);
      }
      CHILD_CHECK((*path)->post_rx(i, desc, dst->region().sub(i * max, max)).ok(), 35);
    }
    auto t0 = Clock::now();
    CHILD_CHECK(rec.wait_rx(kChunks + kLate, 20s), 36);  // every chunk completes, ok or not
    int failures = 0;
    {
      std::lock_guard lock(rec.mu_);
      for (int i = 0; i < kChunks + kLate; ++i) {
        CHILD_CHECK(rec.rx_count[i] == 1, 37);
        if (!rec.rx[i].ok()) {
          ++failures;
          fprintf(stderr, "chunk %d: %s\n", i, rec.rx[i].to_string().c_str());
        }
      }
    }
    (*path)->stop();
    CHILD_CHECK(Clock::now() - t0 < 30s && rec.stopped == 1, 38);
    fprintf(stderr, "peer killed: %d of %d chunks failed; path failed: %d\n", failures, kChunks + kLate, rec.failed);
    (void)owner;
    return 0;
  };
  run_pair([&](UnixChannel c) { return bulk_sender(std::move(c), src_dev, kChunks, kLate); }, receiver, &ra, &rb);
  EXPECT_EQ(rb, 0);
  EXPECT_EQ(ra, 128 + SIGKILL);
}

// One process, in_process paths (what the engine uses between two endpoints of one process once the
// kernel proved it): chunks at odd offsets into every GPU and into host memory arrive byte-exact
// from the exporter's own pointers; a descriptor naming another pid, or an allocation freed after
// its export, fails its chunk with the reason.
TEST(CudaIpcPathGpu, InProcessCopiesFromTheExportersPointers) {
  REQUIRE_GPUS(n);
  pid_t child = testing::fork_child([&] {
    Recorder rec;  // outlives the paths
    auto tx = make_cuda_ipc_path(config(), "self", /*in_process=*/true);
    auto rx = make_cuda_ipc_path(config(), "self", /*in_process=*/true);
    CHILD_CHECK(tx.ok() && rx.ok(), 10);
    (*rx)->start(&rec, nullptr);
    uint64_t seed = fresh_seed();
    const size_t total = (8 << 20) + 4099;
    auto src = Buffer::allocate({MemKind::kCuda, n - 1}, total);
    CHILD_CHECK(src.ok(), 11);
    std::vector<uint8_t> host(total);
    testing::fill_pattern(host.data(), host.size(), seed);
    CHILD_CHECK(host_to(src->region(), host.data()).ok(), 12);
    struct Case {
      MemSpec where;
      size_t src_offset, size;
    };
    std::vector<Case> cases = {{{MemKind::kCuda, 0}, 3, 1},
                               {{MemKind::kCuda, 0}, 4097, (1 << 20) + 3},
                               {{MemKind::kHost, 0}, 11, 4097},
                               {{MemKind::kCuda, n - 1}, 1, (8 << 20) + 1}};
    std::vector<Buffer> dst;
    uint64_t seq = 0;
    for (const Case& c : cases) {
      auto d = Buffer::allocate(c.where, c.size + 7);
      CHILD_CHECK(d.ok(), 13);
      dst.push_back(std::move(*d));
      auto desc = (*tx)->post_tx(seq, src->region().sub(c.src_offset, c.size), true);
      CHILD_CHECK(desc.ok(), 14);
      CHILD_CHECK((*rx)->post_rx(seq, *desc, dst.back().region().sub(5, c.size)).ok(), 15);
      ++seq;
    }
    CHILD_CHECK(rec.wait_rx(seq, 30s), 16);
    for (size_t k = 0; k < cases.size(); ++k) {
      {
        std::lock_guard lock(rec.mu_);
        if (!rec.rx[k].ok()) fprintf(stderr, "chunk %zu: %s\n", k, rec.rx[k].to_string().c_str());
        CHILD_CHECK(rec.rx[k].ok(), 17);
      }
      std::vector<uint8_t> back(cases[k].size);
      CHILD_CHECK(copy_memory({back.data(), back.size(), {}}, dst[k].region().sub(5, cases[k].size)).ok(), 18);
      for (size_t i = 0; i < back.size(); ++i)
        if (back[i] != testing::pattern_byte(seed, cases[k].src_offset + i)) {
          fprintf(stderr, "chunk %zu: byte %zu differs\n", k, i);
          return 19;
        }
    }
    // Another pid in the descriptor: refused at the post, with the reason.
    auto desc = (*tx)->post_tx(seq, src->region().sub(0, 64), true);
    CHILD_CHECK(desc.ok(), 20);
    auto d = IpcChunkDescriptor::decode(*desc);
    CHILD_CHECK(d.ok(), 21);
    d->source.owner_pid += 1;
    Status other = (*rx)->post_rx(seq, d->encode(), dst[1].region().sub(0, 64));
    fprintf(stderr, "other pid: %s\n", other.to_string().c_str());
    CHILD_CHECK(other.code() == Code::kProtocol && other.message().find("names pid") != std::string::npos, 22);
    // Freed after its export: its chunk fails (the driver's buffer id no longer matches).
    auto gone = Buffer::allocate({MemKind::kCuda, 0}, 4096);
    CHILD_CHECK(gone.ok(), 23);
    auto gone_desc = (*tx)->post_tx(seq, gone->region().sub(0, 64), true);
    CHILD_CHECK(gone_desc.ok(), 24);
    *gone = Buffer();
    CHILD_CHECK((*rx)->post_rx(seq, *gone_desc, dst[1].region().sub(0, 64)).ok(), 25);
    ++seq;
    CHILD_CHECK(rec.wait_rx(seq, 30s), 26);
    std::lock_guard lock(rec.mu_);
    fprintf(stderr, "freed: %s\n", rec.rx[seq - 1].to_string().c_str());
    CHILD_CHECK(rec.rx[seq - 1].code() == Code::kNotFound &&
                    rec.rx[seq - 1].message().find("was freed") != std::string::npos,
                27);
    return 0;
  });
  EXPECT_EQ(testing::wait_child(child, std::chrono::seconds(120)), 0);
}

// Both ends in one process without in_process (the engine never does this: cuda_ipc_usable_between
// needs the kernel's proof): a descriptor of our own process must fail its chunk with the reason,
// not crash or hang.
TEST(CudaIpcPathGpu, OwnProcessDescriptorFailsItsChunkWithTheReason) {
  REQUIRE_GPUS(n);
  pid_t child = testing::fork_child([&] {
    Recorder rec;  // outlives the paths
    auto tx = make_cuda_ipc_path(config(), "self");
    auto rx = make_cuda_ipc_path(config(), "self");
    CHILD_CHECK(tx.ok() && rx.ok(), 10);
    (*rx)->start(&rec, nullptr);
    auto src = Buffer::allocate({MemKind::kCuda, 0}, 4096);
    auto dst = Buffer::allocate({MemKind::kCuda, 0}, 4096);
    CHILD_CHECK(src.ok() && dst.ok(), 11);
    auto desc = (*tx)->post_tx(0, src->region(), true);
    CHILD_CHECK(desc.ok(), 12);
    CHILD_CHECK((*rx)->post_rx(0, *desc, dst->region()).ok(), 13);
    CHILD_CHECK(rec.wait_rx(1, 10s), 14);
    std::lock_guard lock(rec.mu_);
    fprintf(stderr, "own-process chunk: %s\n", rec.rx[0].to_string().c_str());
    if (!rec.rx[0].ok()) CHILD_CHECK(rec.rx[0].message().find("this process") != std::string::npos, 15);
    return 0;
  });
  EXPECT_EQ(testing::wait_child(child, std::chrono::seconds(60)), 0);
}

}  // namespace
}  // namespace dmx
