// The shm payload path: byte-exact delivery of chunks (host and sim memory, odd sizes and
// offsets, many in flight both ways), discards, malformed descriptors, stop with chunks pending,
// and the peer killed mid-transfer in a child process. Every wait has a deadline.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <random>

#include "core/config.h"
#include "memory/backend.h"
#include "memory/bounce_pool.h"
#include "memory/sim_device.h"
#include "transport/shm/shm_path.h"
#include "test_env.h"

namespace dmx {
namespace {

using namespace std::chrono_literals;

constexpr auto kWait = 30s;     // generous bound on any single wait in these tests
constexpr auto kPrompt = test::kLoadSlack;  // how fast a failure or a stop must complete every pending chunk

// Records every event; checks each chunk completes exactly once.
class Recorder : public PayloadPath::Events {
 public:
  void on_path_tx_done(uint64_t seq, const Status& s) override { record(true, seq, s); }
  void on_path_rx_done(uint64_t seq, const Status& s) override {
    std::function<void(uint64_t)> hook;
    {
      std::lock_guard lk(mu_);
      hook = rx_hook_;
    }
    if (hook) hook(seq);
    record(false, seq, s);
  }
  void on_path_failed(const Status& s) override {
    std::lock_guard lk(mu_);
    EXPECT_EQ(stopped_, 0) << "on_path_failed after on_path_stopped";
    failed_.push_back(s);
    // Every chunk still pending must complete after this, with an error.
    failed_at_done_count_ = tx_.size() + rx_.size();
    cv_.notify_all();
  }
  void on_path_stopped() override {
    std::lock_guard lk(mu_);
    ++stopped_;
    cv_.notify_all();
  }

  // Called on the path's thread before an rx completion is recorded (to stall the thread).
  void set_rx_hook(std::function<void(uint64_t)> hook) {
    std::lock_guard lk(mu_);
    rx_hook_ = std::move(hook);
  }

  // Waits (deadline) for the completion of tx/rx `seq`; kTimeout if it did not come.
  Status wait(bool tx, uint64_t seq, std::chrono::milliseconds d = kWait) {
    std::unique_lock lk(mu_);
    auto& m = tx ? tx_ : rx_;
    if (!cv_.wait_for(lk, d, [&] { return m.count(seq) != 0; }))
      return Status(Code::kTimeout, fmt::format("test: {} seq {} did not complete", tx ? "tx" : "rx", seq));
    return m.at(seq);
  }
  bool wait_stopped(std::chrono::milliseconds d = kWait) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, d, [&] { return stopped_ > 0; });
  }
  bool wait_failed(std::chrono::milliseconds d = kWait) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, d, [&] { return !failed_.empty(); });
  }
  int stopped() {
    std::lock_guard lk(mu_);
    return stopped_;
  }
  std::vector<Status> failed() {
    std::lock_guard lk(mu_);
    return failed_;
  }
  size_t completions() {
    std::lock_guard lk(mu_);
    return tx_.size() + rx_.size();
  }
  size_t failed_at() {
    std::lock_guard lk(mu_);
    return failed_at_done_count_;
  }

 private:
  void record(bool tx, uint64_t seq, const Status& s) {
    std::lock_guard lk(mu_);
    EXPECT_EQ(stopped_, 0) << "completion after on_path_stopped";
    auto& m = tx ? tx_ : rx_;
    EXPECT_TRUE(m.emplace(seq, s).second) << (tx ? "tx" : "rx") << " seq " << seq << " completed twice";
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Status> tx_, rx_;
  std::vector<Status> failed_;
  size_t failed_at_done_count_ = 0;
  int stopped_ = 0;
  std::function<void(uint64_t)> rx_hook_;
};

// The link options the engine would take from this configuration (no crew: tests add one).
shm::LinkOptions config(const std::string& slots = "16", const std::string& slot_size = "256K") {
  auto c = Config::resolve(Options().set("shm_slots", slots).set("shm_slot_size", slot_size));
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  auto o = shm::link_options(*c);
  EXPECT_TRUE(o.ok()) << o.status().to_string();
  return *o;
}

Deadline secs(int s) { return Deadline::after(std::chrono::seconds(s)); }

std::vector<unsigned char> encode_for_test(uint64_t n) {
  std::vector<unsigned char> d(8);
  for (int i = 0; i < 8; ++i) d[i] = static_cast<unsigned char>(n >> (8 * i));
  return d;
}

// Two started paths over a socketpair in this process: a (creator) and b.
struct Pair {
  std::unique_ptr<PayloadPath> a, b;
  Recorder ra, rb;
  bool ok() const { return a && b; }
  ~Pair() {  // destroying a path joins its thread: no event reaches ra/rb after this
    a.reset();
    b.reset();
  }
};

std::unique_ptr<Pair> make_paths(const shm::LinkOptions& c = config(), std::shared_ptr<CopyCrew> crew_a = nullptr,
                                 std::shared_ptr<CopyCrew> crew_b = nullptr) {
  auto p = std::make_unique<Pair>();
  auto ch = UnixChannel::pair();
  EXPECT_TRUE(ch.ok());
  if (!ch.ok()) return p;
  shm::LinkOptions ca = c, cb = c;
  ca.crew = std::move(crew_a);
  cb.crew = std::move(crew_b);
  auto fut = std::async(std::launch::async, [&] { return make_shm_path(std::move(ch->second), false, cb, secs(10)); });
  auto a = make_shm_path(std::move(ch->first), true, ca, secs(10));
  auto b = fut.get();
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  if (!a.ok() || !b.ok()) return p;
  p->a = std::move(*a);
  p->b = std::move(*b);
  p->a->start(&p->ra, nullptr);
  p->b->start(&p->rb, nullptr);
  return p;
}

// Fresh random bytes, never all zeros: a random non-zero first byte and random others.
void fill_random(void* p, size_t n) {
  static std::mt19937_64 rng{std::random_device{}()};
  auto* b = static_cast<unsigned char*>(p);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x = rng();
    std::memcpy(b + i, &x, 8);
  }
  for (; i < n; ++i) b[i] = static_cast<unsigned char>(rng());
  if (n > 0 && b[0] == 0) b[0] = 0x5A;
}

// Sends n bytes from src offset `so` to dst offset `dso` from `tx` to `rx`, cut into max_chunk
// chunks with seqs starting at *seq (advanced); the receiver posts from its own thread as the
// engine would after reading each header. Checks bytes and guard bytes.
void transfer(PayloadPath& tx, Recorder& rtx, PayloadPath& rx, Recorder& rrx, uint64_t* seq, size_t n, size_t so,
              size_t dso) {
  std::vector<unsigned char> src(n + so), dst(n + dso + 64);
  fill_random(src.data(), src.size());
  fill_random(dst.data(), dst.size());
  std::vector<unsigned char> guard = dst;
  const uint64_t first = *seq;
  std::vector<std::pair<uint64_t, std::vector<unsigned char>>> descs;
  size_t off = 0;
  do {
    size_t len = std::min<size_t>(tx.max_chunk(), n - off);
    auto d = tx.post_tx(*seq, {src.data() + so + off, len, {}}, true);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    descs.emplace_back(*seq, std::move(*d));
    ++*seq;
    off += len;
  } while (off < n);
  auto poster = std::async(std::launch::async, [&] {
    size_t at = 0;
    for (auto& [s, d] : descs) {
      auto len = rx.chunk_length(d);
      if (!len.ok()) return len.status();
      DMX_RETURN_IF_ERROR(rx.post_rx(s, d, {dst.data() + dso + at, *len, {}}));
      at += *len;
    }
    return Status();
  });
  ASSERT_TRUE(poster.get().ok());
  for (uint64_t s = first; s < *seq; ++s) {
    Status st = rtx.wait(true, s);
    ASSERT_TRUE(st.ok()) << st.to_string();
    st = rrx.wait(false, s);
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  if (n > 0) {
    ASSERT_EQ(std::memcmp(dst.data() + dso, src.data() + so, n), 0) << "size " << n;
  }
  ASSERT_EQ(std::memcmp(dst.data(), guard.data(), dso), 0) << "bytes before the destination changed";
  ASSERT_EQ(std::memcmp(dst.data() + dso + n, guard.data() + dso + n, 64), 0) << "bytes after the destination changed";
}

// A batch of chunks from memory `from` to memory `to`, all posted at once: each source and
// destination a buffer of its own, the chunk at an odd offset in it, random bytes everywhere.
struct Batch {
  static constexpr size_t kSrcOff = 3, kDstOff = 5, kTail = 67;
  uint64_t first = 0;
  std::vector<size_t> sizes;
  std::vector<Buffer> src, dst;
  std::vector<std::vector<unsigned char>> data, dst_before;  // what was sent; each dst before
};

// Posts `sizes` from tx to rx (seqs from *seq, advanced): every send, then every recv.
void post_batch(PayloadPath& tx, PayloadPath& rx, uint64_t* seq, MemSpec from, MemSpec to,
                const std::vector<size_t>& sizes, Batch* b) {
  b->first = *seq;
  b->sizes = sizes;
  std::vector<std::vector<unsigned char>> descs;
  for (size_t n : sizes) {
    auto src = Buffer::allocate(from, n + Batch::kSrcOff);
    auto dst = Buffer::allocate(to, n + Batch::kDstOff + Batch::kTail);
    ASSERT_TRUE(src.ok() && dst.ok());
    std::vector<unsigned char> all(src->size()), before(dst->size());
    fill_random(all.data(), all.size());
    fill_random(before.data(), before.size());
    ASSERT_TRUE(copy_memory(src->region(), {all.data(), all.size(), {}}).ok());
    ASSERT_TRUE(copy_memory(dst->region(), {before.data(), before.size(), {}}).ok());
    b->data.emplace_back(all.begin() + Batch::kSrcOff, all.end());
    b->dst_before.push_back(std::move(before));
    b->src.push_back(std::move(*src));
    b->dst.push_back(std::move(*dst));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto d = tx.post_tx(b->first + i, b->src[i].region().sub(Batch::kSrcOff, sizes[i]), true);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    descs.push_back(std::move(*d));
  }
  for (size_t i = 0; i < sizes.size(); ++i)
    ASSERT_TRUE(rx.post_rx(b->first + i, descs[i], b->dst[i].region().sub(Batch::kDstOff, sizes[i])).ok());
  *seq += sizes.size();
}

// Waits for every chunk of the batch on both sides (each wait bounded by `d`).
void wait_batch(Recorder& rtx, Recorder& rrx, const Batch& b, std::chrono::milliseconds d = kWait) {
  for (uint64_t s = b.first; s < b.first + b.sizes.size(); ++s) {
    Status st = rtx.wait(true, s, d);
    ASSERT_TRUE(st.ok()) << st.to_string();
    st = rrx.wait(false, s, d);
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
}

// Every destination holds exactly the bytes sent, and the bytes around it are untouched.
void check_batch(const Batch& b, const std::string& what) {
  for (size_t i = 0; i < b.sizes.size(); ++i) {
    const size_t n = b.sizes[i];
    std::vector<unsigned char> got(b.dst[i].size());
    ASSERT_TRUE(copy_memory({got.data(), got.size(), {}}, b.dst[i].region()).ok());
    ASSERT_EQ(std::memcmp(got.data() + Batch::kDstOff, b.data[i].data(), n), 0) << what << ": chunk " << i << " of " << n << " B";
    const auto& before = b.dst_before[i];
    ASSERT_EQ(std::memcmp(got.data(), before.data(), Batch::kDstOff), 0) << what << ": bytes before chunk " << i;
    ASSERT_EQ(std::memcmp(got.data() + Batch::kDstOff + n, before.data() + Batch::kDstOff + n, Batch::kTail), 0)
        << what << ": bytes after chunk " << i;
  }
}

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

// Simulated device memory (only its copy queue may touch it) on either or both ends.
TEST(ShmPath, SimDeviceMemoryStagedThroughSlots) {
  auto p = make_paths(config("4", "64K"));
  ASSERT_TRUE(p->ok());
  const MemSpec sim{MemKind::kSim, 0}, host{};
  uint64_t seq = 0;
  for (auto [from, to] : {std::pair{sim, sim}, {host, sim}, {sim, host}}) {
    for (size_t n : {size_t(1), size_t(4097), size_t(kShmMaxChunk) - 5}) {
      auto src = Buffer::allocate(from, n + 3);
      auto dst = Buffer::allocate(to, n + 5);
      ASSERT_TRUE(src.ok() && dst.ok());
      std::vector<unsigned char> data(n), back(n);
      fill_random(data.data(), n);
      ASSERT_TRUE(copy_memory(src->region().sub(3, n), {data.data(), n, {}}).ok());
      auto d = p->a->post_tx(seq, src->region().sub(3, n), true);
      ASSERT_TRUE(d.ok()) << d.status().to_string();
      ASSERT_TRUE(p->b->post_rx(seq, *d, dst->region().sub(5, n)).ok());
      Status s = p->ra.wait(true, seq);
      ASSERT_TRUE(s.ok()) << s.to_string();
      s = p->rb.wait(false, seq);
      ASSERT_TRUE(s.ok()) << s.to_string();
      ASSERT_TRUE(copy_memory({back.data(), n, {}}, dst->region().sub(5, n)).ok());
      EXPECT_EQ(std::memcmp(back.data(), data.data(), n), 0) << to_string(from) << " -> " << to_string(to) << " " << n;
      ++seq;
    }
  }
  EXPECT_GT(p->a->stats().device_copies, 0u);
  EXPECT_GT(p->b->stats().device_copies, 0u);
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

// stop() with chunks pending in both directions: prompt, every chunk completes (kClosed), then
// on_path_stopped once; idempotent; later posts are refused. The peer sees the hang-up.
TEST(ShmPath, StopWithChunksPendingCompletesThemPromptly) {
  auto p = make_paths(config("4", "64K"));
  ASSERT_TRUE(p->ok());
  std::vector<unsigned char> src(kShmMaxChunk), dst(kShmMaxChunk);
  fill_random(src.data(), src.size());
  std::vector<unsigned char> desc;
  for (uint64_t s = 0; s < 4; ++s) {  // b never receives: a's ring fills, chunk 0 is mid-way
    auto d = p->a->post_tx(s, {src.data(), src.size(), {}}, true);
    ASSERT_TRUE(d.ok());
    desc = *d;
  }
  for (uint64_t s = 0; s < 4; ++s)  // b never sends these
    ASSERT_TRUE(p->a->post_rx(s, desc, {dst.data(), dst.size(), {}}).ok());
  std::this_thread::sleep_for(20ms);
  auto t0 = Clock::now();
  p->a->stop();
  EXPECT_LT(Clock::now() - t0, kPrompt);
  p->a->stop();  // idempotent
  ASSERT_TRUE(p->ra.wait_stopped(kPrompt));
  for (uint64_t s = 0; s < 4; ++s) {
    for (bool tx : {true, false}) {
      Status st = p->ra.wait(tx, s, 1ms);
      EXPECT_EQ(st.code(), Code::kClosed) << st.to_string();
    }
  }
  EXPECT_TRUE(p->ra.failed().empty());  // a stop is not a failure
  EXPECT_EQ(p->ra.stopped(), 1);
  EXPECT_EQ(p->a->post_tx(9, {src.data(), 1, {}}, true).status().code(), Code::kClosed);
  EXPECT_EQ(p->a->post_rx(9, desc, {nullptr, 0, {}}).code(), Code::kClosed);
  ASSERT_TRUE(p->rb.wait_failed(kPrompt));
  EXPECT_EQ(p->rb.failed()[0].code(), Code::kPeerFailed);
  EXPECT_NE(p->rb.failed()[0].to_string().find("pid " + std::to_string(::getpid())), std::string::npos);
  EXPECT_TRUE(p->rb.wait_stopped(kPrompt));
  EXPECT_EQ(p->ra.stopped(), 1);
}

// A link that staged into device memory holds nothing pinned (its device copies go through the
// process's bounce buffers). Unpinning would wait for an idle device (cudaHostUnregister), which a
// persistent kernel of this process (the Lynx GPU workers) never lets it be, and it runs on the
// stream worker that close() waits for: stopping and destroying the paths waits for no device.
TEST(ShmPath, StopDoesNotWaitForABusyDeviceToUnpinTheSlots) {
  auto p = make_paths(config("4", "64K"));
  ASSERT_TRUE(p->ok());
  const MemSpec sim{MemKind::kSim, 0};
  const size_t n = 4097;
  auto dst = Buffer::allocate(sim, n);
  ASSERT_TRUE(dst.ok());
  std::vector<unsigned char> src(n), back(n);
  fill_random(src.data(), n);
  auto d = p->a->post_tx(0, {src.data(), n, {}}, true);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  ASSERT_TRUE(p->b->post_rx(0, *d, dst->region()).ok());
  ASSERT_TRUE(p->ra.wait(true, 0).ok());
  ASSERT_TRUE(p->rb.wait(false, 0).ok());
  ASSERT_TRUE(copy_memory({back.data(), n, {}}, dst->region()).ok());
  ASSERT_EQ(std::memcmp(back.data(), src.data(), n), 0);
  ASSERT_GT(p->b->stats().device_copies, 0u);

  const uint64_t waits_before = sim_idle_waits();
  sim_hold_device_busy(true);
  // Old code waited here for the device; let it go after a while so that a failure ends.
  std::promise<void> measured;
  auto release = std::async(std::launch::async, [f = measured.get_future()] {
    (void)f.wait_for(20s);
    sim_hold_device_busy(false);
  });
  auto t0 = Clock::now();
  p->b->stop();
  p->b.reset();
  p->a->stop();
  p->a.reset();
  auto took = Clock::now() - t0;
  EXPECT_LT(took, 10s) << "stopping the paths waited "
                       << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                       << " ms for the busy device";
  EXPECT_EQ(sim_idle_waits(), waits_before) << "something waited for the busy device";
  measured.set_value();
  release.get();
}

// The bounce pool exhausted (limited to one piece): the links wait for their own device copies to
// give buffers back, never for more memory, and every byte still arrives, both ways at once.
TEST(ShmPath, SimDeviceChunksCompleteWithTheBouncePoolExhausted) {
  auto p = make_paths(config("8", "64K"));
  ASSERT_TRUE(p->ok());
  struct Restore {
    ~Restore() { set_bounce_limit_for_test(0); }
  } restore;
  set_bounce_limit_for_test(1);  // one 2 MiB piece in use at once, process-wide
  const MemSpec sim{MemKind::kSim, 0}, host{};
  std::mt19937 rng(std::random_device{}());
  uint64_t ab = 0, ba = 0;
  for (auto [from, to] : {std::pair{sim, sim}, {sim, host}, {host, sim}}) {
    std::vector<size_t> sizes{size_t(kShmMaxChunk), 5, (64 << 10) + 9};
    for (int i = 0; i < 13; ++i) sizes.push_back(1 + rng() % (2 << 20));
    Batch there, back;
    ASSERT_NO_FATAL_FAILURE(post_batch(*p->a, *p->b, &ab, from, to, sizes, &there));
    ASSERT_NO_FATAL_FAILURE(post_batch(*p->b, *p->a, &ba, from, to, sizes, &back));
    ASSERT_NO_FATAL_FAILURE(wait_batch(p->ra, p->rb, there));
    ASSERT_NO_FATAL_FAILURE(wait_batch(p->rb, p->ra, back));
    std::string what = to_string(from) + " -> " + to_string(to);
    ASSERT_NO_FATAL_FAILURE(check_batch(there, what + " a->b"));
    ASSERT_NO_FATAL_FAILURE(check_batch(back, what + " b->a"));
  }
  auto pool = BouncePool::of(sim);
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->in_use(), 0u) << "bounce buffers not given back";
  EXPECT_TRUE(p->ra.failed().empty());
  EXPECT_TRUE(p->rb.failed().empty());
}

// Device memory moved through the slots (staged through pinned bounce buffers): odd sizes and
// offsets, both directions at once, many chunks in flight, sim on one end or both.
TEST(ShmPath, SimDeviceChunksOddSizesManyInFlightBothWays) {
  auto p = make_paths(config("4", "64K"));
  ASSERT_TRUE(p->ok());
  const MemSpec sim{MemKind::kSim, 0}, host{};
  std::mt19937 rng(std::random_device{}());
  uint64_t ab = 0, ba = 0;
  for (auto [from, to] : {std::pair{sim, sim}, {host, sim}, {sim, host}}) {
    std::vector<size_t> sizes{1, 63, 4097, (64 << 10) - 1, (64 << 10) + 1, size_t(kShmMaxChunk) - 5};
    for (int i = 0; i < 18; ++i) sizes.push_back(1 + rng() % (1 << 20));
    Batch there, back;
    ASSERT_NO_FATAL_FAILURE(post_batch(*p->a, *p->b, &ab, from, to, sizes, &there));
    ASSERT_NO_FATAL_FAILURE(post_batch(*p->b, *p->a, &ba, from, to, sizes, &back));
    ASSERT_NO_FATAL_FAILURE(wait_batch(p->ra, p->rb, there));
    ASSERT_NO_FATAL_FAILURE(wait_batch(p->rb, p->ra, back));
    std::string what = to_string(from) + " -> " + to_string(to);
    ASSERT_NO_FATAL_FAILURE(check_batch(there, what + " a->b"));
    ASSERT_NO_FATAL_FAILURE(check_batch(back, what + " b->a"));
  }
  EXPECT_GT(p->a->stats().device_copies, 0u);
  EXPECT_GT(p->b->stats().device_copies, 0u);
  EXPECT_TRUE(p->ra.failed().empty());
  EXPECT_TRUE(p->rb.failed().empty());
}

// A persistent kernel of this process (the Lynx GPU workers) keeps the device busy: a call that
// waits for an idle device (cudaHostUnregister, cudaFreeHost) then waits until the kernel stops,
// holding the driver's process-wide lock, and every other CUDA call of the process waits behind it
// (issue 42). With such a kernel running, a link that did device copies closes; then a second
// link's device copies, both ways, and its close complete promptly, and no call waited for the
// device.
TEST(ShmPath, DeviceCopiesGoOnAfterALinkClosesWhileAKernelRuns) {
  const MemSpec sim{MemKind::kSim, 0}, host{};
  const std::vector<size_t> sizes{4097, (1 << 20) + 3, 77};
  const uint64_t waits_before = sim_idle_waits();
  Batch b1, b2, b3, b4;  // their buffers are freed last, after the "kernel" stopped (cudaFree waits too)
  sim_hold_device_busy(true);
  // Old code waited for the device; let it go after a while so that a failure ends.
  std::promise<void> measured;
  auto release = std::async(std::launch::async, [f = measured.get_future()] {
    (void)f.wait_for(20s);
    sim_hold_device_busy(false);
  });
  auto t0 = Clock::now();
  {
    auto p = make_paths(config("4", "64K"));
    ASSERT_TRUE(p->ok());
    uint64_t ab = 0, ba = 0;
    ASSERT_NO_FATAL_FAILURE(post_batch(*p->a, *p->b, &ab, host, sim, sizes, &b1));
    ASSERT_NO_FATAL_FAILURE(post_batch(*p->b, *p->a, &ba, sim, host, sizes, &b2));
    ASSERT_NO_FATAL_FAILURE(wait_batch(p->ra, p->rb, b1));
    ASSERT_NO_FATAL_FAILURE(wait_batch(p->rb, p->ra, b2));
    p->b->stop();
    p->a->stop();
  }  // both links destroyed
  // Whatever the close left to run on threads of its own gets the time to start.
  for (auto t1 = Clock::now(); sim_idle_waits() == waits_before && Clock::now() - t1 < 1s;)
    std::this_thread::sleep_for(1ms);
  {
    auto p = make_paths(config("4", "64K"));
    ASSERT_TRUE(p->ok());
    uint64_t ab = 0, ba = 0;
    ASSERT_NO_FATAL_FAILURE(post_batch(*p->a, *p->b, &ab, sim, host, sizes, &b3));
    ASSERT_NO_FATAL_FAILURE(post_batch(*p->b, *p->a, &ba, host, sim, sizes, &b4));
    ASSERT_NO_FATAL_FAILURE(wait_batch(p->ra, p->rb, b3));
    ASSERT_NO_FATAL_FAILURE(wait_batch(p->rb, p->ra, b4));
    p->a->stop();
    p->b->stop();
  }
  auto took = Clock::now() - t0;
  EXPECT_LT(took, 10s) << "the second link's device copies and close waited "
                       << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                       << " ms, behind a call waiting for the busy device";
  EXPECT_EQ(sim_idle_waits(), waits_before) << "a call waited for the device while the kernel ran";
  measured.set_value();
  release.get();
  ASSERT_NO_FATAL_FAILURE(check_batch(b1, "first link a->b"));
  ASSERT_NO_FATAL_FAILURE(check_batch(b2, "first link b->a"));
  ASSERT_NO_FATAL_FAILURE(check_batch(b3, "second link a->b"));
  ASSERT_NO_FATAL_FAILURE(check_batch(b4, "second link b->a"));
}

// stop() before start(): start() still ends with exactly one on_path_stopped; posts were refused.
TEST(ShmPath, StopBeforeStart) {
  auto ch = UnixChannel::pair();
  ASSERT_TRUE(ch.ok());
  shm::LinkOptions c = config();
  auto fut = std::async(std::launch::async, [&] { return make_shm_path(std::move(ch->second), false, c, secs(10)); });
  auto a = make_shm_path(std::move(ch->first), true, c, secs(10));
  auto b = fut.get();
  ASSERT_TRUE(a.ok() && b.ok());
  (*a)->stop();
  char x = 1;
  EXPECT_EQ((*a)->post_tx(0, {&x, 1, {}}, true).status().code(), Code::kClosed);
  Recorder r;
  (*a)->start(&r, nullptr);
  EXPECT_TRUE(r.wait_stopped(kPrompt));
  a->reset();
  EXPECT_EQ(r.stopped(), 1);
  EXPECT_EQ(r.completions(), 0u);
  b->reset();  // never started: no events, nothing to wait for
}

// A path destroyed on its own thread (the last keep_alive dropped after on_path_stopped) must not
// deadlock or crash. (Whoever calls stop() must hold a reference: the path may go as it returns.)
TEST(ShmPath, KeepAliveReleasedAfterStopped) {
  struct Holder {
    std::unique_ptr<PayloadPath> path;
  };
  auto holder = std::make_shared<Holder>();
  auto ch = UnixChannel::pair();
  ASSERT_TRUE(ch.ok());
  shm::LinkOptions c = config();
  auto fut = std::async(std::launch::async, [&] { return make_shm_path(std::move(ch->second), false, c, secs(10)); });
  auto a = make_shm_path(std::move(ch->first), true, c, secs(10));
  auto b = fut.get();
  ASSERT_TRUE(a.ok() && b.ok());
  holder->path = std::move(*a);
  Recorder r, rb;
  std::weak_ptr<Holder> weak = holder;
  holder->path->start(&r, holder);
  (*b)->start(&rb, nullptr);
  holder.reset();  // only the path's thread keeps it now; this thread no longer touches it
  b->reset();       // the peer goes: the path fails, stops, and drops the last reference itself
  EXPECT_TRUE(r.wait_stopped(kPrompt));
  auto t0 = Clock::now();
  while (!weak.expired() && Clock::now() - t0 < kPrompt) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(weak.expired());
  ASSERT_EQ(r.failed().size(), 1u);
  EXPECT_EQ(r.failed()[0].code(), Code::kPeerFailed);
}

// ---- the peer killed mid-transfer (a child process) ----------------------------------------------

class Quiet : public PayloadPath::Events {
  void on_path_tx_done(uint64_t, const Status&) override {}
  void on_path_rx_done(uint64_t, const Status&) override {}
  void on_path_failed(const Status&) override {}
  void on_path_stopped() override {}
};

TEST(ShmPath, PeerKilledMidTransferFailsEveryPendingChunk) {
  constexpr size_t kSmall = 1000, kBig = kShmMaxChunk;
  static std::vector<unsigned char> child_src(kBig);  // before fork: the child sends from it
  fill_random(child_src.data(), child_src.size());
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  auto ch = UnixChannel::pair();
  ASSERT_TRUE(ch.ok());
  shm::LinkOptions c = config("4", "64K");
  pid_t child = ::fork();
  if (child == 0) {
    { UnixChannel drop = std::move(ch->first); }
    auto path = make_shm_path(std::move(ch->second), false, c, secs(10));
    if (!path.ok()) ::_exit(50);
    Quiet q;
    (*path)->start(&q, nullptr);
    // seq 0: small, arrives whole; seq 1: 4 MiB through a 256 KiB ring, cut short by the kill.
    if (!(*path)->post_tx(0, {child_src.data(), kSmall, {}}, true).ok()) ::_exit(51);
    if (!(*path)->post_tx(1, {child_src.data(), kBig, {}}, true).ok()) ::_exit(52);
    char r = 'r';
    (void)!::write(ready[1], &r, 1);
    for (;;) ::pause();
  }
  ASSERT_GT(child, 0);
  struct Reaper {  // kills the child if an assertion ends the test early
    pid_t pid;
    ~Reaper() {
      if (pid > 0 && ::kill(pid, SIGKILL) == 0) ::waitpid(pid, nullptr, 0);
    }
  } reaper{child};
  ::close(ready[1]);  // a child that dies early reads as EOF below, not a hang
  { UnixChannel drop = std::move(ch->second); }
  auto made = make_shm_path(std::move(ch->first), true, c, secs(10));
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  std::unique_ptr<PayloadPath> path = std::move(*made);
  Recorder r;
  // Stall the path's thread in the completion of seq 0 until the child is dead: by then it has
  // copied part of seq 1 (at most a ring's worth: the child cannot publish more).
  std::promise<void> in_hook, release;
  auto released = release.get_future().share();
  r.set_rx_hook([&, once = std::make_shared<std::once_flag>()](uint64_t seq) {
    if (seq != 0) return;
    std::call_once(*once, [&] {
      in_hook.set_value();
      released.wait_for(kWait);
    });
  });
  path->start(&r, nullptr);
  std::vector<unsigned char> small(kSmall), big(kBig), out(kBig);
  fill_random(out.data(), out.size());
  char x;
  ASSERT_EQ(::read(ready[0], &x, 1), 1) << "the child did not get ready";
  auto d0 = encode_for_test(kSmall), d1 = encode_for_test(kBig);
  ASSERT_TRUE(path->post_rx(0, d0, {small.data(), kSmall, {}}).ok());
  ASSERT_TRUE(path->post_rx(1, d1, {big.data(), kBig, {}}).ok());
  ASSERT_TRUE(path->post_rx(2, d0, {small.data(), kSmall, {}}).ok());  // never sent
  // The child receives nothing: these stay pending (the first one mid-way, the ring full).
  for (uint64_t s = 0; s < 3; ++s) ASSERT_TRUE(path->post_tx(s, {out.data(), out.size(), {}}, true).ok());
  ASSERT_EQ(in_hook.get_future().wait_for(kWait), std::future_status::ready);
  ::kill(child, SIGKILL);
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  reaper.pid = -1;
  auto t0 = Clock::now();
  release.set_value();

  ASSERT_TRUE(r.wait_stopped(kWait));
  EXPECT_LT(Clock::now() - t0, kPrompt);
  Status s0 = r.wait(false, 0, 1ms);
  EXPECT_TRUE(s0.ok()) << s0.to_string();
  EXPECT_EQ(std::memcmp(small.data(), child_src.data(), kSmall), 0);
  std::vector<Status> failed = r.failed();
  ASSERT_EQ(failed.size(), 1u);
  const std::string pid = "pid " + std::to_string(child);
  EXPECT_EQ(failed[0].code(), Code::kPeerFailed) << failed[0].to_string();
  EXPECT_NE(failed[0].to_string().find(pid), std::string::npos) << failed[0].to_string();
  EXPECT_EQ(r.failed_at(), 1u) << "only rx seq 0 completed before on_path_failed";
  for (auto [tx, seq] : {std::pair{false, 1}, {false, 2}, {true, 0}, {true, 1}, {true, 2}}) {
    Status s = r.wait(tx, seq, 1ms);
    EXPECT_EQ(s.code(), Code::kPeerFailed) << (tx ? "tx " : "rx ") << seq << ": " << s.to_string();
    EXPECT_NE(s.to_string().find(pid), std::string::npos) << s.to_string();
  }
  EXPECT_EQ(r.completions(), 6u);
  EXPECT_EQ(path->post_tx(7, {out.data(), 1, {}}, true).status().code(), Code::kPeerFailed);
  path.reset();
  EXPECT_EQ(r.stopped(), 1);
  ::close(ready[0]);
}

}  // namespace
}  // namespace dmx

namespace dmx {
namespace {

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
