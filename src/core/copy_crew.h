// A few threads that share one large host copy with its caller. One core copies from DRAM at what
// the misses it can keep in flight allow (about 8-11 GB/s on the GPU machine's VMs), well below
// what the memory moves: a second core on the same copy nearly doubles it.
//
// The caller cuts the copy into pieces and takes pieces itself; helpers that are awake take the
// others. A helper asleep when the copy starts costs nothing but a late start: the caller never
// waits for a helper to wake, only for pieces a helper has already begun. Helpers start at the
// first copy (a crew that never copies has no threads), spin briefly after each copy for the
// next one (a large message is many copies back to back) and then sleep.
//
// The same helpers run any work cut in pieces (run()): checking and laying out a long list.
//
// Thread-safe: one copy or run at a time uses the helpers; one that finds them taken by another
// caller runs on its caller alone.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

namespace dmx {

class CopyCrew {
 public:
  // `threads`: how many threads share a copy, the caller included (1: the caller alone). `piece`:
  // the unit a thread takes (a multiple of 64); copies shorter than two pieces are the caller's.
  explicit CopyCrew(int threads, size_t piece = kDefaultPiece);
  // A crew of `threads`, or null for one thread (its copies are then plain memcpy/stream_copy).
  static std::shared_ptr<CopyCrew> make(int threads) {
    return threads > 1 ? std::make_shared<CopyCrew>(threads) : nullptr;
  }
  ~CopyCrew();  // stops and joins the helpers (no copy may be running)
  CopyCrew(const CopyCrew&) = delete;
  CopyCrew& operator=(const CopyCrew&) = delete;

  // Copies n bytes from src to dst (not overlapping), as memcpy, or as stream_copy (non-temporal
  // stores) when `nt`. Returns when every byte is copied and visible to the caller.
  void copy(void* dst, const void* src, size_t n, bool nt);
  // Copies each segment (none overlapping another), as copy() does: a list of small copies (the
  // pieces of a KV-cache list) shared out in runs of whole segments of about a piece each.
  struct Segment {
    void* dst;
    const void* src;
    size_t n;
  };
  void copy(std::span<const Segment> segments, bool nt);

  // Calls work(i) for every i in [0, pieces), each once, on the caller and the helpers awake;
  // returns when every call has returned. Calls run at once on different threads.
  void run(size_t pieces, const std::function<void(size_t)>& work);

  // The threads a crew gets on a machine of `cpus` CPUs: only where there are cores to spare.
  static int automatic_threads(unsigned cpus);

  int threads() const { return helpers_wanted_ + 1; }
  // Copies and runs shared with at least one helper piece, and pieces helpers took (tests, stats).
  uint64_t shared_copies() const { return shared_copies_.load(std::memory_order_relaxed); }
  uint64_t helper_pieces() const { return helper_pieces_.load(std::memory_order_relaxed); }

  static constexpr size_t kDefaultPiece = 256 * 1024;  // ~25 µs of one core: the caller's longest wait

 private:
  void start_helpers();
  // One job of `pieces` (at most 0xffff) pieces, its fields set; true when a helper took part.
  bool run_job(uint32_t pieces);
  void helper();
  // Takes the next piece of job `gen`; false when the job has none left (or is another job).
  bool claim(uint32_t gen, uint32_t* piece);
  void copy_piece(uint32_t piece);
  static void copy_alone(const Segment& g, bool nt);

  const int helpers_wanted_;
  const size_t piece_;
  std::mutex use_mu_;  // held by the caller whose copy the helpers share
  std::once_flag started_;
  std::vector<std::thread> helpers_;

  // The job: its generation, piece count and next piece in one word, which is also what sleeping
  // helpers wait on. The fields below are written by the caller before it publishes a new
  // generation, and read by helpers only after claiming a piece of it (the caller rewrites them
  // only once every piece is done).
  std::atomic<uint64_t> word_{0};
  std::atomic<uint32_t> done_{0};  // pieces of the current job finished
  std::atomic<bool> stop_{false};
  char* dst_ = nullptr;
  const char* src_ = nullptr;
  size_t n_ = 0;
  bool nt_ = false;
  // A job of segments: piece i copies segments_[runs_[i], runs_[i + 1]) (null: dst_, src_, n_).
  const Segment* segments_ = nullptr;
  // A run(): piece i is work_(first_ + i) (null: a copy).
  const std::function<void(size_t)>* work_ = nullptr;
  size_t first_ = 0;
  std::vector<size_t> runs_;

  std::atomic<uint64_t> shared_copies_{0}, helper_pieces_{0};
};

}  // namespace dmx
