// CUDA copy queues' lists (CopyQueue::copy_list, memory/cuda/list_copy.h) on a GPU: an inline
// table's pieces gathered into a staging buffer and scattered out of one, byte-exact at odd sizes
// and offsets; the bytes between spans untouched; refusals (kUnavailable) that enqueue nothing.
// Every case skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "memory/backend.h"
#include "test_env.h"

namespace dmx {
namespace {

constexpr MemSpec kCuda0{MemKind::kCuda, 0};
constexpr auto kWait = std::chrono::seconds(30);

class CudaListTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto n = cuda_device_count();
    if (!n.ok()) DMX_SKIP(::dmx::test::kNoGpu) << n.status().message();
    auto b = backend_for(kCuda0);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    backend_ = *b;
    auto q = backend_->create_queue();
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    q_ = std::move(*q);
  }
  void TearDown() override {
    q_.reset();
    for (auto [p, n] : staging_) backend_->free_staging(p, n);
  }
  unsigned char* staging(size_t n) {
    auto s = backend_->allocate_staging(n);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (!s.ok()) return nullptr;
    staging_.emplace_back(*s, n);
    return static_cast<unsigned char*>(*s);
  }
  void fill(unsigned char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(rng_());
  }
  void sync() {
    auto f = q_->record();
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    ASSERT_TRUE(q_->wait(*f, Deadline::after(kWait)).ok());
  }
  std::vector<unsigned char> device_bytes(const Buffer& b) {
    std::vector<unsigned char> out(b.size());
    EXPECT_TRUE(copy_memory(MemRegion{out.data(), out.size(), MemSpec{}}, b.region()).ok());
    return out;
  }

  MemoryBackend* backend_ = nullptr;
  std::unique_ptr<CopyQueue> q_;
  std::vector<std::pair<void*, size_t>> staging_;
  std::mt19937_64 rng_{std::random_device{}()};
};

// Disjoint pieces of a buffer of `total` bytes: odd lengths from 0 to past a segment (64 KiB),
// odd offsets, shuffled.
struct Piece {
  size_t at, n;
};
std::vector<Piece> pieces(std::mt19937_64& rng, size_t count, size_t* total) {
  std::vector<Piece> out;
  size_t at = 0;
  for (size_t i = 0; i < count; ++i) {
    size_t n = i % 50 == 0 ? 0 : i % 17 == 0 ? 70000 + rng() % 100000 : 1 + rng() % 9000;
    at += rng() % 13;  // a gap
    out.push_back(Piece{at, n});
    at += n;
  }
  *total = at + 1;
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

TEST_F(CudaListTest, GatherAndScatterAreByteExact) {
  size_t dev_size = 0;
  std::vector<Piece> ps = pieces(rng_, 600, &dev_size);
  size_t sum = 0;
  for (const Piece& p : ps) sum += p.n;
  auto src = Buffer::allocate(kCuda0, dev_size);
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  std::vector<unsigned char> src_bytes(dev_size);
  fill(src_bytes.data(), dev_size);
  ASSERT_TRUE(copy_memory(src->region(), MemRegion{src_bytes.data(), dev_size, MemSpec{}}).ok());

  // Gather into a slot: packed, but every 7th piece after a 3-byte gap that must stay as it was.
  unsigned char* slot = staging(sum + 3 * ps.size() + 64);
  ASSERT_NE(slot, nullptr);
  std::vector<unsigned char> before(sum + 3 * ps.size() + 64);
  fill(before.data(), before.size());
  std::memcpy(slot, before.data(), before.size());
  std::vector<CopyQueue::Span> spans;
  std::vector<unsigned char> want = before;
  size_t at = 5;  // an odd start
  for (size_t i = 0; i < ps.size(); ++i) {
    if (i % 7 == 0) at += 3;
    spans.push_back(CopyQueue::Span{slot + at, static_cast<char*>(src->data()) + ps[i].at, ps[i].n});
    std::memcpy(want.data() + at, src_bytes.data() + ps[i].at, ps[i].n);
    at += ps[i].n;
  }
  ASSERT_TRUE(q_->copy_list(spans.data(), spans.size(), true).ok());
  sync();
  EXPECT_EQ(0, std::memcmp(slot, want.data(), want.size())) << "the gathered slot (or a gap) differs";

  // Scatter the slot's bytes to the same pieces of a poisoned buffer: the rest stays poison.
  auto dst = Buffer::allocate(kCuda0, dev_size);
  ASSERT_TRUE(dst.ok());
  std::vector<unsigned char> expect(dev_size);
  fill(expect.data(), dev_size);
  ASSERT_TRUE(copy_memory(dst->region(), MemRegion{expect.data(), dev_size, MemSpec{}}).ok());
  fill(slot, before.size());
  for (CopyQueue::Span& s : spans) {
    size_t piece_at = static_cast<const char*>(s.src) - static_cast<char*>(src->data());
    unsigned char* from = static_cast<unsigned char*>(s.dst);
    s = CopyQueue::Span{static_cast<char*>(dst->data()) + piece_at, from, s.n};
    std::memcpy(expect.data() + piece_at, from, s.n);
  }
  ASSERT_TRUE(q_->copy_list(spans.data(), spans.size(), false).ok());
  sync();
  EXPECT_TRUE(device_bytes(*dst) == expect) << "a scattered piece, or the poison between, differs";
}

// Buffers of lists are free only once a fence after them completed: with none recorded, the
// queue's buffers run out and it refuses (nothing enqueued); after a fence they serve again, and
// every list that was taken landed.
TEST_F(CudaListTest, BusyBuffersRefuseUntilAFenceCompletes) {
  const size_t kLists = 40, kPiece = 3001, kPer = 4;
  auto src = Buffer::allocate(kCuda0, kLists * kPer * kPiece);
  ASSERT_TRUE(src.ok());
  std::vector<unsigned char> bytes(src->size());
  fill(bytes.data(), bytes.size());
  ASSERT_TRUE(copy_memory(src->region(), MemRegion{bytes.data(), bytes.size(), MemSpec{}}).ok());
  unsigned char* slot = staging(src->size());
  ASSERT_NE(slot, nullptr);
  std::memset(slot, 0, src->size());
  size_t taken = 0, refused = 0;
  for (size_t l = 0; l < kLists; ++l) {
    std::vector<CopyQueue::Span> spans;
    for (size_t k = 0; k < kPer; ++k) {
      size_t at = (l * kPer + (kPer - 1 - k)) * kPiece;  // reversed within the list
      spans.push_back(CopyQueue::Span{slot + at, static_cast<char*>(src->data()) + at, kPiece});
    }
    Status s = q_->copy_list(spans.data(), spans.size(), true);
    if (s.ok()) {
      ASSERT_EQ(refused, 0u) << "a list taken after one was refused";
      ++taken;
    } else {
      EXPECT_EQ(s.code(), Code::kUnavailable) << s.to_string();
      EXPECT_NE(s.message().find("in use"), std::string::npos) << s.message();
      ++refused;
    }
  }
  EXPECT_GT(taken, 0u);
  EXPECT_GT(refused, 0u) << "no bound on the lists in flight";
  sync();
  EXPECT_EQ(0, std::memcmp(slot, bytes.data(), taken * kPer * kPiece));
  for (size_t i = taken * kPer * kPiece; i < bytes.size(); ++i) ASSERT_EQ(slot[i], 0) << "a refused list wrote " << i;
  CopyQueue::Span again[] = {{slot, src->data(), 10}, {slot + 10, static_cast<char*>(src->data()) + 10, 10}};
  EXPECT_TRUE(q_->copy_list(again, 2, true).ok()) << "buffers not free after a fence";
  sync();
}

// A device side the queue's device does not own (host memory, a range past its allocation) is
// refused before anything is enqueued, and the queue goes on.
TEST_F(CudaListTest, DeviceSidesOutsideTheDevicesMemoryAreRefused) {
  auto dev = Buffer::allocate(kCuda0, 4096);
  ASSERT_TRUE(dev.ok());
  unsigned char* slot = staging(8192);
  ASSERT_NE(slot, nullptr);
  std::vector<unsigned char> host(4096, 7);
  CopyQueue::Span from_host[] = {{slot, dev->data(), 100}, {slot + 100, host.data(), 100}};
  Status s = q_->copy_list(from_host, 2, true);
  EXPECT_EQ(s.code(), Code::kUnavailable) << s.to_string();
  CopyQueue::Span past[] = {{dev->data(), slot, 100}, {static_cast<char*>(dev->data()) + 4000, slot + 100, size_t{4} << 20}};
  s = q_->copy_list(past, 2, false);
  EXPECT_EQ(s.code(), Code::kUnavailable) << s.to_string();
  std::memset(slot, 0x33, 8192);
  CopyQueue::Span ok[] = {{dev->data(), slot, 4000}, {static_cast<char*>(dev->data()) + 4000, slot + 4000, 96}};
  ASSERT_TRUE(q_->copy_list(ok, 2, false).ok());
  sync();
  EXPECT_TRUE(device_bytes(*dev) == std::vector<unsigned char>(4096, 0x33));
}

}  // namespace
}  // namespace dmx
