// GPU-managed orchestration: the work is launched before requests arrive and polls a doorbell
// ring (SplitRPC's persistent-thread launch type; Lynx's polling accelerator). The CPU handler
// only rings; a TX thread watches the completion ring. On host memory a worker thread plays the
// persistent kernel over a ring that lives in the pool.
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "rpc/cuda/device.h"
#include "rpc/orchestrator.h"
#include "rpc/service.h"

namespace dmx::rpc {
namespace {

constexpr uint32_t kStop = 0xffffffffu;  // a ring entry that tells the consumer to exit

// Host rings in the pool's doorbell words: [0] head, [8] done head, then entries and done entries.
class HostRings {
 public:
  HostRings(uint32_t* words, uint32_t cap) : w_(words), cap_(cap) {}
  std::atomic_ref<uint32_t> head() const { return std::atomic_ref<uint32_t>(w_[0]); }
  std::atomic_ref<uint32_t> done_head() const { return std::atomic_ref<uint32_t>(w_[8]); }
  uint32_t& entry(uint32_t i) const { return w_[32 + i % cap_]; }
  uint32_t& done_entry(uint32_t i) const { return w_[32 + cap_ + i % cap_]; }

 private:
  uint32_t* w_;
  uint32_t cap_;
};

// Waits until `word` differs from `seen`: a short spin, then the futex.
uint32_t await_change(std::atomic_ref<uint32_t> word, uint32_t seen) {
  for (int i = 0; i < 256; ++i) {
    uint32_t v = word.load(std::memory_order_acquire);
    if (v != seen) return v;
  }
  word.wait(seen, std::memory_order_acquire);
  return word.load(std::memory_order_acquire);
}

class DoorbellOrchestrator final : public Orchestrator {
 public:
  DoorbellOrchestrator(const OrchestratorConfig& c, const Pool& pool, Finish finish)
      : config_(c), pool_(pool), finish_(std::move(finish)), jobs_(pool.total_slots()),
        cap_(pool.total_slots() + 1) {}
  ~DoorbellOrchestrator() override { stop(); }

  Status start() {
    if (pool_.shape().mem.kind == MemKind::kCuda) {
      DMX_ASSIGN_OR_RETURN(gpu_, device::Persistent::create(pool_.shape().mem.device, pool_.total_slots()));
    } else {
      rings_.emplace(pool_.doorbell_words(), cap_);  // the pool keeps 2 * (slots + 1) + 32 words
      worker_ = std::thread([this] { host_worker(); });
    }
    tx_ = std::thread([this] { tx_loop(); });
    return Status();
  }

  void submit(Job job) override {
    std::unique_lock<std::mutex> lock(ring_mu_);
    if (stopping_) {
      lock.unlock();
      finish_(job, Status(Code::kClosed, "rpc server stopping"));
      return;
    }
    uint32_t g = job.global;
    jobs_[g] = std::move(job);
    ++submitted_;
    if (gpu_) {
      device::Item& it = gpu_->items()[g];
      it = {pool_.request(g).ptr, pool_.response(g).ptr, jobs_[g].len, static_cast<uint8_t>(jobs_[g].method)};
      gpu_->ring(g);
    } else {
      ring_host(g);
    }
  }

  void stop() override {
    {
      std::lock_guard<std::mutex> lock(ring_mu_);
      if (stopped_) return;
      stopping_ = true;
      stop_deadline_ = std::chrono::steady_clock::now() + config_.work_timeout;
      if (!gpu_ && worker_.joinable()) ring_host(kStop);
    }
    if (worker_.joinable()) worker_.join();
    if (tx_.joinable()) tx_.join();
    if (gpu_) (void)gpu_->stop(config_.work_timeout);
    std::vector<Job> left;
    {
      std::lock_guard<std::mutex> lock(ring_mu_);
      for (Job& j : jobs_)
        if (j.conn) left.push_back(std::move(j));
      stopped_ = true;
    }
    for (Job& j : left) finish_(j, Status(Code::kClosed, "rpc server stopped before the work finished"));
  }

 private:
  // Single producer under ring_mu_.
  void ring_host(uint32_t g) {
    auto head = rings_->head();
    uint32_t h = head.load(std::memory_order_relaxed);
    rings_->entry(h) = g;
    head.store(h + 1, std::memory_order_release);
    head.notify_one();
  }

  // Plays the persistent kernel: takes rung slots in order, computes, publishes completions.
  void host_worker() {
    auto head = rings_->head();
    auto done = rings_->done_head();
    for (uint32_t tail = 0;;) {
      uint32_t h = await_change(head, tail);
      for (; tail != h; ++tail) {
        uint32_t g = rings_->entry(tail);
        if (g != kStop) {
          run_host(jobs_method(g), static_cast<const unsigned char*>(pool_.request(g).ptr), jobs_len(g),
                   static_cast<unsigned char*>(pool_.response(g).ptr));
        }
        uint32_t d = done.load(std::memory_order_relaxed);
        rings_->done_entry(d) = g;
        done.store(d + 1, std::memory_order_release);
        done.notify_one();
        if (g == kStop) return;
      }
    }
  }

  // The worker reads only what submit() wrote before its release store of the head.
  Method jobs_method(uint32_t g) const { return jobs_[g].method; }
  uint32_t jobs_len(uint32_t g) const { return jobs_[g].len; }

  void tx_loop() {
    if (gpu_) return tx_gpu();
    auto done = rings_->done_head();
    for (uint32_t tail = 0;;) {
      uint32_t d = await_change(done, tail);
      for (; tail != d; ++tail) {
        uint32_t g = rings_->done_entry(tail);
        if (g == kStop) return;
        complete(g);
      }
    }
  }

  void tx_gpu() {
    uint32_t got[64];
    int idle = 0;
    for (;;) {
      uint32_t n = gpu_->poll_done(got, 64);
      for (uint32_t i = 0; i < n; ++i) complete(got[i]);
      if (n > 0) {
        idle = 0;
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(ring_mu_);
        if (stopping_ && (completed_ == submitted_ || std::chrono::steady_clock::now() > stop_deadline_)) return;
      }
      if (++idle > 2000) std::this_thread::sleep_for(std::chrono::microseconds(20));
      else std::this_thread::yield();
    }
  }

  void complete(uint32_t g) {
    Job j;
    {
      std::lock_guard<std::mutex> lock(ring_mu_);
      j = std::move(jobs_[g]);
      jobs_[g] = Job{};
      ++completed_;
    }
    finish_(j, Status());
  }

  OrchestratorConfig config_;
  const Pool& pool_;
  Finish finish_;
  std::mutex ring_mu_;  // guards jobs_ (but see jobs_method), the producer side, counters, flags
  std::vector<Job> jobs_;
  uint32_t cap_;
  uint64_t submitted_ = 0, completed_ = 0;
  bool stopping_ = false, stopped_ = false;
  std::chrono::steady_clock::time_point stop_deadline_;
  std::optional<HostRings> rings_;
  std::unique_ptr<device::Persistent> gpu_;
  std::thread worker_, tx_;
};

}  // namespace

Result<std::unique_ptr<Orchestrator>> make_doorbell_orchestrator(const OrchestratorConfig& config,
                                                                 const Pool& pool, Orchestrator::Finish finish) {
  auto o = std::make_unique<DoorbellOrchestrator>(config, pool, std::move(finish));
  DMX_RETURN_IF_ERROR(o->start());
  return std::unique_ptr<Orchestrator>(std::move(o));
}

}  // namespace dmx::rpc
