#include "transport/loop_transport.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include <fmt/format.h>

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

class LoopPath final : public PayloadPath {
 public:
  ~LoopPath() override { stop(); }
  std::string_view name() const override { return "loop"; }
  void start(Events* events, std::shared_ptr<void> keep_alive) override {
    std::lock_guard<std::mutex> lock(mu_);
    events_ = events;
    thread_ = std::thread([this, keep = std::move(keep_alive)] { run(); });
  }
  bool carries(const MemSpec& src) const override { return host_memory(src); }
  uint64_t max_chunk() const override { return kMaxChunk; }
  Result<std::vector<unsigned char>> post_tx(uint64_t, const MemRegion& src, bool) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Status(Code::kClosed, "loop path: stopped");
    std::vector<unsigned char> d(16);
    auto addr = reinterpret_cast<uintptr_t>(src.ptr);
    std::memcpy(d.data(), &addr, 8);
    std::memcpy(d.data() + 8, &src.size, 8);
    ++stats_.chunks_sent;
    stats_.bytes_sent += src.size;
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
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Status(Code::kClosed, "loop path: stopped");
    jobs_.push_back(Job{seq, reinterpret_cast<const void*>(addr), n, dst});
    cv_.notify_one();
    return Status();
  }
  bool receiver_releases() const override { return true; }
  void stop() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      cv_.notify_one();
    }
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  }
  PathStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  std::string describe() const override { return "loop (test transport: copies from the sender's pointer)"; }

 private:
  struct Job {
    uint64_t seq;
    const void* src;
    uint64_t len;
    MemRegion dst;
  };

  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (stopping_) break;
      Job j = jobs_.front();
      jobs_.pop_front();
      Status s;
      if (j.dst.ptr != nullptr && !host_memory(j.dst.where))
        s = Status(Code::kUnavailable, "loop path: reaches host memory only");
      else if (j.dst.ptr != nullptr)
        copy_from_peer(j.dst.ptr, j.src, j.len);
      if (j.dst.ptr != nullptr && j.len > 0 && corrupt_next.load() > 0 && corrupt_next.fetch_sub(1) > 0)
        static_cast<unsigned char*>(j.dst.ptr)[j.len / 2] ^= 0x40;
      ++stats_.chunks_received;
      stats_.bytes_received += j.len;
      ++stats_.host_copies;
      lock.unlock();
      events_->on_path_rx_done(j.seq, s);
      lock.lock();
    }
    auto left = std::move(jobs_);
    lock.unlock();
    for (const Job& j : left) events_->on_path_rx_done(j.seq, Status(Code::kClosed, "loop path: stopped"));
    events_->on_path_stopped();
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  Events* events_ = nullptr;
  std::deque<Job> jobs_;
  bool stopping_ = false;
  PathStats stats_;
  std::thread thread_;
};

class LoopTransport final : public Transport {
 public:
  std::string_view name() const override { return "loop"; }
  // The side channel's kernel credentials prove the peer is this process (admit).
  TransportNeeds needs() const override { return {.side_channel = true}; }
  Result<std::vector<unsigned char>> offer(const Config& config) override {
    if (!transport_allowed(config, "loop")) return Status(Code::kUnavailable, "loop: not asked");
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
    DMX_ASSIGN_OR_RETURN(shm::UnixChannel ch, b.side_channel());  // served its purpose (admit)
    TransportLink link;
    link.path = std::make_unique<LoopPath>();
    return link;
  }
};

}  // namespace

void corrupt_loop_chunks(int n) { corrupt_next.store(n); }

std::shared_ptr<Transport> make_loop_transport() { return std::make_shared<LoopTransport>(); }

}  // namespace dmx::test
