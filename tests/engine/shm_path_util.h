// Helpers of the shm payload path's tests (shm_path_test.cc, shm_path_device_test.cc,
// shm_path_stop_test.cc): an event recorder that checks each chunk completes exactly once, two
// started paths over a socket pair, fresh random bytes, transfers and batches checked byte for byte.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "memory/backend.h"
#include "test_env.h"
#include "transport/shm/shm_path.h"

namespace dmx::shm_test {

using namespace std::chrono_literals;

inline constexpr auto kWait = 30s;     // generous bound on any single wait in these tests
inline constexpr auto kPrompt = test::kLoadSlack;  // how fast a failure or a stop must complete every pending chunk

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
inline shm::LinkOptions config(const std::string& slots = "16", const std::string& slot_size = "256K") {
  auto c = Config::resolve(Options().set("shm_slots", slots).set("shm_slot_size", slot_size));
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  auto o = shm::link_options(*c);
  EXPECT_TRUE(o.ok()) << o.status().to_string();
  return *o;
}

inline Deadline secs(int s) { return Deadline::after(std::chrono::seconds(s)); }

inline std::vector<unsigned char> encode_for_test(uint64_t n) {
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

inline std::unique_ptr<Pair> make_paths(const shm::LinkOptions& c = config(), std::shared_ptr<CopyCrew> crew_a = nullptr,
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
inline void fill_random(void* p, size_t n) {
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
inline void transfer(PayloadPath& tx, Recorder& rtx, PayloadPath& rx, Recorder& rrx, uint64_t* seq, size_t n, size_t so,
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
inline void post_batch(PayloadPath& tx, PayloadPath& rx, uint64_t* seq, MemSpec from, MemSpec to,
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
inline void wait_batch(Recorder& rtx, Recorder& rrx, const Batch& b, std::chrono::milliseconds d = kWait) {
  for (uint64_t s = b.first; s < b.first + b.sizes.size(); ++s) {
    Status st = rtx.wait(true, s, d);
    ASSERT_TRUE(st.ok()) << st.to_string();
    st = rrx.wait(false, s, d);
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
}

// Every destination holds exactly the bytes sent, and the bytes around it are untouched.
inline void check_batch(const Batch& b, const std::string& what) {
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

}  // namespace dmx::shm_test
