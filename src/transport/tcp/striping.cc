#include "transport/tcp/striping.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <utility>
#include <vector>

#include "wire/handshake.h"

namespace dmx::tcp {
namespace {

// How many more chunks a data stream may have taken and not written than the least loaded one.
constexpr uint32_t kStreamSlack = 1;

class TcpStriping final : public Striping {
 public:
  explicit TcpStriping(StripingSetup s) : setup_(std::move(s)), load_(setup_.streams) {
    assert(setup_.streams > 1 && "one stream needs no striping");
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
    size_t least = 1;
    for (size_t i = 2; i < load_.size(); ++i)
      if (load(i) < load(least)) least = i;
    if (load(static_cast<size_t>(stream)) <= load(least) + kStreamSlack) return true;
    setup_.wake(static_cast<int>(least));
    return false;
  }

  void took(int stream) override { load_[static_cast<size_t>(stream)].fetch_add(1, std::memory_order_relaxed); }
  void wrote(int stream) override {
    auto& l = load_[static_cast<size_t>(stream)];
    if (l.load(std::memory_order_relaxed) > 0) l.fetch_sub(1, std::memory_order_relaxed);
  }

  // Waking them all for a one-chunk message had every parked stream race for it.
  void wake_for(uint64_t total, uint64_t remaining, const MemSpec& where) override {
    std::array<std::pair<uint32_t, uint8_t>, wire::stream_sockets(wire::kMaxStreams)> by_load;
    size_t n = 0;
    for (size_t i = 1; i < load_.size(); ++i) by_load[n++] = {load(i), static_cast<uint8_t>(i)};
    uint64_t c = chunk(total, where);
    uint64_t chunks = std::max<uint64_t>(1, (remaining + c - 1) / c);
    size_t wake = static_cast<size_t>(std::min<uint64_t>(chunks, n));
    std::partial_sort(by_load.begin(), by_load.begin() + wake, by_load.begin() + n);
    for (size_t i = 0; i < wake; ++i) setup_.wake(by_load[i].second);
  }

 private:
  uint32_t load(size_t i) const { return load_[i].load(std::memory_order_relaxed); }

  const StripingSetup setup_;
  std::vector<std::atomic<uint32_t>> load_;  // per stream: chunks taken and not yet written
};

}  // namespace

std::unique_ptr<Striping> make_striping(StripingSetup setup) {
  return std::make_unique<TcpStriping>(std::move(setup));
}

}  // namespace dmx::tcp
