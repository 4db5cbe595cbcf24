#include "core/copy_crew.h"

#include <pthread.h>

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

void CopyCrew::copy_piece(uint32_t piece) {
  size_t at = size_t{piece} * piece_;
  size_t len = n_ - at < piece_ ? n_ - at : piece_;
  if (nt_)
    stream_copy(dst_ + at, src_ + at, len);
  else
    std::memcpy(dst_ + at, src_ + at, len);
  done_.fetch_add(1, std::memory_order_release);
}

void CopyCrew::copy(void* dst, const void* src, size_t n, bool nt) {
  if (n == 0) return;  // src and dst may then be null, which memcpy does not allow
  std::unique_lock<std::mutex> use(use_mu_, std::defer_lock);
  if (helpers_wanted_ == 0 || n < 2 * piece_ || !use.try_lock()) {
    if (nt)
      stream_copy(dst, src, n);
    else
      std::memcpy(dst, src, n);
    return;
  }
  std::call_once(started_, [this] { start_helpers(); });
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  bool shared = false;
  while (n > 0) {
    size_t job = n < kMaxPieces * piece_ ? n : kMaxPieces * piece_;
    shared |= run_job(d, s, job, nt);
    d += job;
    s += job;
    n -= job;
  }
  if (shared) shared_copies_.fetch_add(1, std::memory_order_relaxed);
}

bool CopyCrew::run_job(char* dst, const char* src, size_t n, bool nt) {
  dst_ = dst;
  src_ = src;
  n_ = n;
  nt_ = nt;
  const auto pieces = static_cast<uint32_t>((n + piece_ - 1) / piece_);
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
