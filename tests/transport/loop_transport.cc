#include "transport/loop_transport.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <vector>

#include <fmt/format.h>

#include "transport/path_base.h"

namespace dmx::test {
namespace {

constexpr uint64_t kMaxChunk = 4 << 20;
std::atomic<int> corrupt_next{0};

bool host_memory(const MemSpec& m) { return m.kind == MemKind::kHost || m.kind == MemKind::kPinned; }

// Reads the sender's memory. The descriptor that named it came through the control stream (a
// socket or the shm pipe), an ordering ThreadSanitizer cannot see, as two processes would not
// share the memory at all: the read is left out of its view. Volatile reads, so that the compiler
// makes no memcpy call of the loop (the sanitizer intercepts memcpy wherever it is called from).
__attribute__((no_sanitize("thread"), noinline)) void copy_from_peer(void* dst, const void* src, uint64_t n) {
  auto* d = static_cast<unsigned char*>(dst);
  const volatile auto* s = static_cast<const volatile unsigned char*>(src);
  for (uint64_t i = 0; i < n; ++i) d[i] = s[i];
}

class LoopPath final : public PathBase {
 public:
  explicit LoopPath(std::string name)
      : PathBase({.thread_name = "dmx-loop", .stopped = Status(Code::kClosed, "loop path: stopped")}),
        name_(std::move(name)) {}
  ~LoopPath() override { end_thread(); }
  std::string_view name() const override { return name_; }
  bool carries(const MemSpec& src) const override { return host_memory(src); }
  uint64_t max_chunk() const override { return kMaxChunk; }
  Result<std::vector<unsigned char>> post_tx(uint64_t, const MemRegion& src, bool) override {
    if (stopping() || failed()) return gate();  // the lock only once closed
    std::vector<unsigned char> d(16);
    auto addr = reinterpret_cast<uintptr_t>(src.ptr);
    std::memcpy(d.data(), &addr, 8);
    std::memcpy(d.data() + 8, &src.size, 8);
    PathCounters::add(counters_.chunks_sent);
    PathCounters::add(counters_.bytes_sent, src.size);
    return d;
  }
  Result<uint64_t> chunk_length(std::span<const unsigned char> d) override {
    uint64_t n = 0;
    if (d.size() != 16) return Status(Code::kProtocol, fmt::format("loop path: a {}-byte descriptor", d.size()));
    std::memcpy(&n, d.data() + 8, 8);
    if (n > kMaxChunk) return Status(Code::kProtocol, fmt::format("loop path: a chunk of {} B", n));
    return n;
  }
  Status post_rx(uint64_t seq, std::span<const unsigned char> d, const MemRegion& dst) override {
    DMX_ASSIGN_OR_RETURN(uint64_t n, chunk_length(d));
    uintptr_t addr = 0;
    std::memcpy(&addr, d.data(), 8);
    return post([&] { jobs_.push_back(Job{seq, {Piece{reinterpret_cast<const void*>(addr), n, dst}}}); });
  }
  // Lists (table chunks): the descriptor is each piece's address and length, 16 bytes each.
  size_t max_list() const override { return kMaxListDescriptor / 16; }
  Result<std::vector<unsigned char>> post_tx_list(uint64_t, std::span<const MemRegion> srcs, size_t* taken) override {
    if (stopping() || failed()) return gate();
    *taken = std::min<size_t>(srcs.size(), max_list());
    std::vector<unsigned char> d(16 * *taken);
    for (size_t k = 0; k < *taken; ++k) {
      auto addr = reinterpret_cast<uintptr_t>(srcs[k].ptr);
      std::memcpy(d.data() + 16 * k, &addr, 8);
      std::memcpy(d.data() + 16 * k + 8, &srcs[k].size, 8);
      PathCounters::add(counters_.bytes_sent, srcs[k].size);
    }
    PathCounters::add(counters_.chunks_sent);
    return d;
  }
  Status post_rx_list(uint64_t seq, std::span<const unsigned char> d, std::span<const MemRegion> dsts) override {
    if (d.size() != 16 * dsts.size())
      return Status(Code::kProtocol, fmt::format("loop path: a {}-byte descriptor for {} pieces", d.size(), dsts.size()));
    Job job{seq, {}};
    for (size_t k = 0; k < dsts.size(); ++k) {
      uintptr_t addr = 0;
      uint64_t n = 0;
      std::memcpy(&addr, d.data() + 16 * k, 8);
      std::memcpy(&n, d.data() + 16 * k + 8, 8);
      if (n != dsts[k].size)
        return Status(Code::kProtocol, fmt::format("loop path: piece {} of {} B, the table says {}", k, n, dsts[k].size));
      job.pieces.push_back(Piece{reinterpret_cast<const void*>(addr), n, dsts[k]});
    }
    return post([&] { jobs_.push_back(std::move(job)); });
  }
  bool receiver_releases() const override { return true; }
  std::string describe() const override { return "loop (test transport: copies from the sender's pointer)"; }

 private:
  struct Piece {
    const void* src;
    uint64_t len;
    MemRegion dst;
  };
  struct Job {
    uint64_t seq;
    std::vector<Piece> pieces;  // a chunk's one, or a list's
  };

  // PathBase: each round copies what was posted; stop() waits for the thread (the default).
  bool progress(std::vector<Done>* done) override {
    std::deque<Job> jobs;
    take_posts([&] { jobs.swap(jobs_); });
    for (const Job& j : jobs) {
      Status s;
      for (const Piece& p : j.pieces) {
        if (p.dst.ptr != nullptr && !host_memory(p.dst.where))
          s = Status(Code::kUnavailable, "loop path: reaches host memory only");
        else if (p.dst.ptr != nullptr)
          copy_from_peer(p.dst.ptr, p.src, p.len);
        if (p.dst.ptr != nullptr && p.len > 0 && corrupt_next.load() > 0 && corrupt_next.fetch_sub(1) > 0)
          static_cast<unsigned char*>(p.dst.ptr)[p.len / 2] ^= 0x40;
        PathCounters::add(counters_.bytes_received, p.len);
        PathCounters::add(counters_.host_copies);
      }
      PathCounters::add(counters_.chunks_received);
      done->push_back({false, j.seq, s});
    }
    return !jobs.empty();
  }
  void release(const Status& why, std::vector<Done>* done) override {
    std::deque<Job> left;
    take_posts([&] { left.swap(jobs_); });
    for (const Job& j : left) done->push_back({false, j.seq, why});
  }

  const std::string name_;
  std::deque<Job> jobs_;  // under the post lock (PathBase::post)
};

class LoopTransport final : public Transport {
 public:
  explicit LoopTransport(std::string name) : name_(std::move(name)) {}
  std::string_view name() const override { return name_; }
  // The side channel's kernel credentials prove the peer is this process (admit).
  TransportNeeds needs() const override { return {.side_channel = true}; }
  Result<std::vector<unsigned char>> offer(const Config& config) override {
    if (!transport_allowed(config, name_)) return Status(Code::kUnavailable, name_ + ": not asked");
    return std::vector<unsigned char>{1};
  }
  Status compatible(std::span<const unsigned char> a, std::span<const unsigned char> b,
                    const PeerPair& pair) const override {
    if (a.size() != 1 || b.size() != 1 || a[0] != 1 || b[0] != 1) return Status(Code::kUnavailable, "loop: version");
    if (!pair.same_pid) return Status(Code::kUnavailable, "loop: only within one process");
    return Status();
  }
  Status admit(const PeerPair&, bool same_process) const override {
    return same_process ? Status() : Status(Code::kUnavailable, "loop: the peer is not this process");
  }
  std::string role(const PeerPair&) const override { return "host sources go by loop"; }
  std::string when() const override { return "tests only"; }
  Result<TransportLink> connect(Bootstrap& b) override {
    if (!b.same_process()) return Status(Code::kProtocol, "loop: the peer is not this process");
    DMX_ASSIGN_OR_RETURN(UnixChannel ch, b.side_channel());  // served its purpose (admit)
    TransportLink link;
    link.path = std::make_unique<LoopPath>(name_);
    return link;
  }

 private:
  const std::string name_;
};

}  // namespace

void corrupt_loop_chunks(int n) { corrupt_next.store(n); }

std::shared_ptr<Transport> make_loop_transport(std::string name) {
  return std::make_shared<LoopTransport>(std::move(name));
}

}  // namespace dmx::test
