// CPU-managed orchestration, as SplitRPC's sync worker loop: per request (cpu) the work runs on
// the thread that completed the request — dmx's, which then queues the response on its own
// stream, with no hand-off either way (on 2 vCPUs two wake-ups cost more than the 64 KiB vecop);
// per dynamic batch (batch, graph) a worker thread takes every ready request into one launch.
#include <condition_variable>
#include <deque>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "rpc/cuda/device.h"
#include "rpc/orchestrator.h"
#include "rpc/service.h"

namespace dmx::rpc {
namespace {

class CpuOrchestrator final : public Orchestrator {
 public:
  CpuOrchestrator(const OrchestratorConfig& c, const Pool& pool, Finish finish)
      : config_(c), pool_(pool), finish_(std::move(finish)) {}
  ~CpuOrchestrator() override { stop(); }

  Status start() {
    if (pool_.shape().mem.kind == MemKind::kCuda) {
      DMX_ASSIGN_OR_RETURN(launcher_,
                           device::Launcher::create(pool_.shape().mem.device, config_.mode == Mode::kGraph));
    }
    if (config_.mode != Mode::kCpu) worker_ = std::thread([this] { loop(); });
    return Status();
  }

  void submit(Job job) override {
    if (config_.mode == Mode::kCpu) return run_inline(job);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stopping_) {
        queue_.push_back(std::move(job));  // bounded: one entry per pool slot at most
        cv_.notify_one();
        return;
      }
    }
    finish_(job, Status(Code::kClosed, "rpc server stopping"));
  }

  void stop() override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      stopping_ = true;
      cv_.notify_all();
      cv_.wait(lock, [this] { return inline_running_ == 0; });  // no deadline: the work has its own
      if (!worker_.joinable()) return;
    }
    worker_.join();
  }

 private:
  // cpu mode: one request, on the caller's thread. One launcher (CUDA stream) serves every
  // connection, so launches take turns; host work runs side by side.
  void run_inline(Job& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) {
        finish_(job, Status(Code::kClosed, "rpc server stopping"));
        return;
      }
      ++inline_running_;
    }
    std::unique_lock<std::mutex> launch;
    if (launcher_) launch = std::unique_lock<std::mutex>(launch_mu_);
    Status s = run(std::span<const Job>(&job, 1), inline_items_);  // host work leaves items alone
    if (launch) launch.unlock();
    finish_(job, s);
    std::lock_guard<std::mutex> lock(mu_);
    if (--inline_running_ == 0 && stopping_) cv_.notify_all();
  }

  void loop() {
    uint32_t max = config_.mode == Mode::kBatch || config_.mode == Mode::kGraph ? config_.max_batch : 1;
    std::vector<Job> batch;
    std::vector<device::Item> items;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        while (!queue_.empty() && batch.size() < max) {
          batch.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
      }
      Status s = run(batch, items);
      for (Job& j : batch) finish_(j, s);
      batch.clear();
    }
  }

  Status run(std::span<const Job> batch, std::vector<device::Item>& items) {
    if (!launcher_) {
      for (const Job& j : batch)
        run_host(j.method, static_cast<const unsigned char*>(pool_.request(j.global).ptr), j.len,
                 static_cast<unsigned char*>(pool_.response(j.global).ptr));
      return Status();
    }
    items.clear();
    for (const Job& j : batch)
      items.push_back({pool_.request(j.global).ptr, pool_.response(j.global).ptr, j.len,
                       static_cast<uint8_t>(j.method)});
    return launcher_->run(items.data(), static_cast<uint32_t>(items.size()), config_.work_timeout);
  }

  OrchestratorConfig config_;
  const Pool& pool_;
  Finish finish_;
  std::unique_ptr<device::Launcher> launcher_;
  std::mutex mu_;  // guards queue_, stopping_, inline_running_
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  int inline_running_ = 0;  // cpu mode: jobs running on callers' threads
  std::mutex launch_mu_;    // cpu mode on CUDA: guards launcher_ and inline_items_
  std::vector<device::Item> inline_items_;
  std::thread worker_;
};

}  // namespace

Result<std::unique_ptr<Orchestrator>> make_cpu_orchestrator(const OrchestratorConfig& config, const Pool& pool,
                                                            Orchestrator::Finish finish) {
  auto o = std::make_unique<CpuOrchestrator>(config, pool, std::move(finish));
  DMX_RETURN_IF_ERROR(o->start());
  return std::unique_ptr<Orchestrator>(std::move(o));
}

}  // namespace dmx::rpc
