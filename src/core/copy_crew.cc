#include "core/copy_crew.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/stream_copy.h"
#include "core/sys.h"

namespace dmx {
namespace {

// How long an idle helper keeps looking for the next copy before it sleeps: longer than the gap
// between two slot copies of one message, short enough to cost little after the last.
constexpr auto kHelperSpin = std::chrono::microseconds(200);

// The job word: generation (32 bits), pieces (16), next piece to take (16).
constexpr uint64_t pack(uint32_t gen, uint32_t pieces, uint32_t next) {
  return (uint64_t{gen} << 32) | (uint64_t{pieces} << 16) | next;
}
constexpr uint32_t gen_of(uint64_t w) { return static_cast<uint32_t>(w >> 32); }
constexpr uint32_t pieces_of(uint64_t w) { return static_cast<uint32_t>(w >> 16) & 0xffff; }
constexpr uint32_t next_of(uint64_t w) { return static_cast<uint32_t>(w) & 0xffff; }
constexpr size_t kMaxPieces = 0xffff;

}  // namespace

CopyCrew::CopyCrew(int threads, size_t piece)
    : helpers_wanted_(threads > 1 ? threads - 1 : 0), piece_(piece < 64 ? 64 : piece / 64 * 64) {}

CopyCrew::~CopyCrew() {
  stop_.store(true, std::memory_order_release);
  word_.store(pack(gen_of(word_.load()) + 1, 0, 0), std::memory_order_release);  // a job of no pieces
  word_.notify_all();
  for (auto& t : helpers_) t.join();
}

void CopyCrew::start_helpers() {
  helpers_.reserve(helpers_wanted_);
  for (int i = 0; i < helpers_wanted_; ++i) {
    helpers_.emplace_back([this] { helper(); });
    // Named here, not by the thread itself: named once the first shared copy returns.
    pthread_setname_np(helpers_.back().native_handle(), "dmx-copy");
  }
}

bool CopyCrew::claim(uint32_t gen, uint32_t* piece) {
  uint64_t w = word_.load(std::memory_order_acquire);
  while (true) {
    uint32_t next = next_of(w);
    if (gen_of(w) != gen || next >= pieces_of(w)) return false;
    if (word_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
      *piece = next;
      return true;
    }
  }
}

int CopyCrew::automatic_threads(unsigned cpus) {
  // On two CPUs a helper took 1 MiB shm messages from 38 to 16 GB/s. Four a side moved 1 MiB at
  // 1.05-1.55x a memcpy on 32 CPUs (2xH200) and 1.33-2.17x on 16 (1xH200), where two moved
  // 0.72-0.76x and 0.66-0.87x; on 8 of the H200's CPUs 1.4-1.5x two's rate, on 4 no better
  // (docs/performance.md).
  return cpus >= 8 ? 4 : cpus >= 4 ? 2 : 1;
}

void CopyCrew::copy_piece(uint32_t piece) {
  if (work_ != nullptr) {
    (*work_)(first_ + piece);
  } else if (segments_ != nullptr) {
    for (size_t k = runs_[piece]; k < runs_[piece + 1]; ++k) copy_alone(segments_[k], nt_);
  } else {
    size_t at = size_t{piece} * piece_;
    copy_alone({dst_ + at, src_ + at, n_ - at < piece_ ? n_ - at : piece_}, nt_);
  }
  done_.fetch_add(1, std::memory_order_release);
}

void CopyCrew::copy(void* dst, const void* src, size_t n, bool nt) {
  if (n == 0) return;  // src and dst may then be null, which memcpy does not allow
  std::unique_lock<std::mutex> use(use_mu_, std::defer_lock);
  if (helpers_wanted_ == 0 || n < 2 * piece_ || !use.try_lock()) {
    copy_alone({dst, src, n}, nt);
    return;
  }
  std::call_once(started_, [this] { start_helpers(); });
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  bool shared = false;
  segments_ = nullptr;
  nt_ = nt;
  while (n > 0) {
    size_t job = n < kMaxPieces * piece_ ? n : kMaxPieces * piece_;
    dst_ = d;
    src_ = s;
    n_ = job;
    shared |= run_job(static_cast<uint32_t>((job + piece_ - 1) / piece_));
    d += job;
    s += job;
    n -= job;
  }
  if (shared) shared_copies_.fetch_add(1, std::memory_order_relaxed);
}

void CopyCrew::copy(std::span<const Segment> segments, bool nt) {
  size_t total = 0;
  for (const Segment& g : segments) total += g.n;
  std::unique_lock<std::mutex> use(use_mu_, std::defer_lock);
  if (helpers_wanted_ == 0 || total < 2 * piece_ || segments.size() > kMaxPieces || !use.try_lock()) {
    for (const Segment& g : segments) copy_alone(g, nt);
    return;
  }
  std::call_once(started_, [this] { start_helpers(); });
  runs_.assign(1, 0);
  size_t bytes = 0;
  for (size_t k = 0; k < segments.size(); ++k) {
    bytes += segments[k].n;
    if (bytes >= piece_ && k + 1 < segments.size()) {
      runs_.push_back(k + 1);
      bytes = 0;
    }
  }
  runs_.push_back(segments.size());
  segments_ = segments.data();
  nt_ = nt;
  if (run_job(static_cast<uint32_t>(runs_.size() - 1))) shared_copies_.fetch_add(1, std::memory_order_relaxed);
  segments_ = nullptr;
}

void CopyCrew::run(size_t pieces, const std::function<void(size_t)>& work) {
  std::unique_lock<std::mutex> use(use_mu_, std::defer_lock);
  if (helpers_wanted_ == 0 || pieces < 2 || !use.try_lock()) {
    for (size_t i = 0; i < pieces; ++i) work(i);
    return;
  }
  std::call_once(started_, [this] { start_helpers(); });
  segments_ = nullptr;
  work_ = &work;
  bool shared = false;
  for (first_ = 0; first_ < pieces; first_ += kMaxPieces)
    shared |= run_job(static_cast<uint32_t>(std::min(pieces - first_, kMaxPieces)));
  work_ = nullptr;
  if (shared) shared_copies_.fetch_add(1, std::memory_order_relaxed);
}

void CopyCrew::copy_alone(const Segment& g, bool nt) {
  if (g.n == 0) return;
  if (nt)
    stream_copy(g.dst, g.src, g.n);
  else
    std::memcpy(g.dst, g.src, g.n);
}

bool CopyCrew::run_job(uint32_t pieces) {
  done_.store(0, std::memory_order_relaxed);
  const uint32_t gen = gen_of(word_.load(std::memory_order_relaxed)) + 1;
  word_.store(pack(gen, pieces, 0), std::memory_order_release);
  word_.notify_all();
  uint32_t piece, mine = 0;
  while (claim(gen, &piece)) {
    copy_piece(piece);
    ++mine;
  }
  // Pieces a helper began: each is at most a piece, so this spin is short.
  while (done_.load(std::memory_order_acquire) != pieces) cpu_relax();
  if (mine == pieces) return false;
  helper_pieces_.fetch_add(pieces - mine, std::memory_order_relaxed);
  return true;
}

void CopyCrew::helper() {
  uint64_t seen = word_.load(std::memory_order_acquire);
  while (!stop_.load(std::memory_order_acquire)) {
    uint32_t gen = gen_of(seen), piece;
    while (claim(gen, &piece)) copy_piece(piece);
    // Spin for the next generation, then sleep until the word changes.
    auto until = std::chrono::steady_clock::now() + kHelperSpin;
    uint64_t w;
    while ((w = word_.load(std::memory_order_acquire)) == seen && std::chrono::steady_clock::now() < until)
      cpu_relax();
    if (w == seen) {
      // Whatever changed the word after our last look: wait() returns at once.
      word_.wait(seen, std::memory_order_acquire);
      w = word_.load(std::memory_order_acquire);
    }
    seen = w;
  }
}

}  // namespace dmx
