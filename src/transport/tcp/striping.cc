#include "transport/tcp/striping.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "wire/handshake.h"

namespace dmx::tcp {
namespace {

// How many more chunks a data stream may have taken and not written than the least loaded one.
constexpr uint32_t kStreamSlack = 1;

class TcpStriping final : public Striping {
 public:
  explicit TcpStriping(StripingSetup s)
      : setup_(std::move(s)), load_(room()), down_(room()), last_done_(room()), ns_per_chunk_(room()),
        end_(setup_.streams) {
    assert(setup_.streams > 1 && "one stream needs no striping");
    for (size_t i = setup_.streams; i < down_.size(); ++i) down_[i].store(true, std::memory_order_relaxed);
  }

  // A 1 MiB message on 8 streams would otherwise ride one of them. Device memory keeps
  // chunk_size, the unit its staging copies are fastest at (docs/performance.md).
  uint64_t chunk(uint64_t total, const MemSpec& where) const override {
    uint64_t data_streams = setup_.streams - 1;  // beside the control stream
    if (where.is_device() || total >= data_streams * setup_.chunk_size) return setup_.chunk_size;
    return std::min(setup_.host_chunk_size, setup_.chunk_size);
  }

  // The control stream pulls none: an RTS or CTS must not wait behind megabytes of data in its
  // socket while the data streams run dry. Reads the loads without a lock, which a busy-polling
  // stream would otherwise take on every pass: they are a hint, each changed by one stream.
  bool pulls(int stream) override {
    if (stream == 0) return false;
    if (setup_.acked) return pulls_by_completion(static_cast<size_t>(stream));
    size_t least = static_cast<size_t>(stream);
    for (size_t i = 1; i < end(); ++i)
      if (!is_down(i) && load(i) < load(least)) least = i;
    if (load(static_cast<size_t>(stream)) <= load(least) + kStreamSlack) return true;
    setup_.wake(static_cast<int>(least));
    return false;
  }

  void down(int stream) override { down_[static_cast<size_t>(stream)].store(true, std::memory_order_relaxed); }
  void up(int stream) override {
    auto i = static_cast<size_t>(stream);
    if (i >= down_.size()) return;
    down_[i].store(false, std::memory_order_relaxed);
    if (i + 1 > end_.load(std::memory_order_relaxed)) end_.store(i + 1, std::memory_order_release);
  }

  // Acknowledged completions: the chunk goes to the stream expected to finish it first, by each
  // stream's time per chunk while it was busy (a slow link gets less, and at the end of a
  // transfer none is left waiting on it). Streams not yet measured fall back to the load rule.
  bool pulls_by_completion(size_t stream) {
    size_t best = stream;
    uint64_t best_at = finish_at(stream);
    bool measured = best_at != 0;
    for (size_t i = 1; i < end() && measured; ++i) {
      if (is_down(i) || i == stream) continue;
      uint64_t at = finish_at(i);
      measured = at != 0;
      if (at < best_at) best = i, best_at = at;
    }
    if (!measured) {
      size_t least = stream;
      for (size_t i = 1; i < end(); ++i)
        if (!is_down(i) && load(i) < load(least)) least = i;
      if (load(stream) <= load(least) + kStreamSlack) return true;
      setup_.wake(static_cast<int>(least));
      return false;
    }
    // Within half of the best stream's chunk time: ties go to whoever asks, sparing a wake-up.
    if (finish_at(stream) <= best_at + per_chunk(best) / 2) return true;
    setup_.wake(static_cast<int>(best));
    return false;
  }
  uint64_t per_chunk(size_t i) const { return ns_per_chunk_[i].load(std::memory_order_relaxed); }
  // When stream i would finish one more chunk, from now, in ns: 0 when not measured yet.
  uint64_t finish_at(size_t i) const { return per_chunk(i) * (load(i) + 1); }

  void took(int stream) override {
    auto i = static_cast<size_t>(stream);
    if (load_[i].fetch_add(1, std::memory_order_relaxed) == 0 && setup_.acked)
      last_done_[i].store(static_cast<uint64_t>(Clock::now().time_since_epoch().count()), std::memory_order_relaxed);
  }
  void wrote(int stream) override {
    auto i = static_cast<size_t>(stream);
    auto& l = load_[i];
    uint32_t before = l.load(std::memory_order_relaxed);
    if (before > 0) l.fetch_sub(1, std::memory_order_relaxed);
    if (!setup_.acked) return;
    // Time per chunk, averaged: from the previous completion, or from when the stream took a
    // chunk while it had none (took()), so idle time does not count.
    auto now = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
    uint64_t last = last_done_[i].exchange(now, std::memory_order_relaxed);
    if (last != 0 && now > last) {
      uint64_t d = now - last, old = per_chunk(i);
      ns_per_chunk_[i].store(old == 0 ? d : (old * 7 + d) / 8, std::memory_order_relaxed);
    }
  }

  // Waking them all for a one-chunk message had every parked stream race for it.
  void wake_for(uint64_t total, uint64_t remaining, const MemSpec& where) override {
    std::array<std::pair<uint32_t, uint16_t>, wire::stream_sockets(wire::kMaxStreams)> by_load;
    size_t n = 0;
    for (size_t i = 1; i < end() && n < by_load.size(); ++i)
      if (!is_down(i)) by_load[n++] = {static_cast<uint32_t>(load(i)), static_cast<uint16_t>(i)};
    uint64_t c = chunk(total, where);
    uint64_t chunks = std::max<uint64_t>(1, (remaining + c - 1) / c);
    size_t wake = static_cast<size_t>(std::min<uint64_t>(chunks, n));
    std::partial_sort(by_load.begin(), by_load.begin() + wake, by_load.begin() + n);
    for (size_t i = 0; i < wake; ++i) setup_.wake(by_load[i].second);
  }

 private:
  size_t room() const { return std::max(setup_.streams, setup_.capacity); }
  size_t end() const { return end_.load(std::memory_order_acquire); }  // streams in use: [0, end)
  uint32_t load(size_t i) const { return load_[i].load(std::memory_order_relaxed); }
  bool is_down(size_t i) const { return down_[i].load(std::memory_order_relaxed); }

  const StripingSetup setup_;
  std::vector<std::atomic<uint32_t>> load_;  // per stream: chunks taken and not yet written (or acknowledged)
  std::vector<std::atomic<bool>> down_;      // per stream: gone (down())
  // Acknowledged completions (StripingSetup::acked), per stream: when the last came, and the
  // average time per chunk while busy (0: not measured yet). Written under the endpoint's lock.
  std::vector<std::atomic<uint64_t>> last_done_, ns_per_chunk_;
  std::atomic<size_t> end_;  // up() raises it
};

}  // namespace

std::unique_ptr<Striping> make_striping(StripingSetup setup) {
  return std::make_unique<TcpStriping>(std::move(setup));
}

}  // namespace dmx::tcp
