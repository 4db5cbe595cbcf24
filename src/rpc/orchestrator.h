// rpc/orchestrator.h — who starts the work once a request's payload sits in the pool.
//
//   cpu   CPU-managed: the thread that completed a request (dmx's) runs it at once (host memory:
//         calls the service; CUDA: launches a kernel and waits, one launch at a time), one
//         request per launch.
//   batch CPU-managed with dynamic batching: the worker takes every ready request, up to
//         max_batch, into one launch.
//   graph batch, launched as a CUDA graph captured once per batch size (the item table is copied
//         in by the graph itself), so a batch costs one cudaGraphLaunch. Host memory: as batch.
//   gpu   GPU-managed: the work is already running and polls a doorbell ring. CUDA: a persistent
//         kernel polls a ring in mapped pinned memory. Host memory: a worker thread polls a ring
//         in the pool (the same structure, so the code path is tested without a GPU). A TX thread
//         watches the completion ring and hands finished slots back.
//
// submit() is thread-safe; `finish` runs once per job, on an orchestrator thread — in cpu mode on
// the submitting thread, within submit() (the only mode whose submit waits for the work).
// stop() waits for running jobs and joins the threads after finishing queued jobs with kClosed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "dmx/status.h"
#include "rpc/header.h"
#include "rpc/pool.h"

namespace dmx::rpc {

class Conn;

enum class Mode : uint8_t { kCpu, kBatch, kGpu, kGraph };
Result<Mode> parse_mode(std::string_view text);
std::string_view mode_name(Mode mode);

struct Job {
  std::shared_ptr<Conn> conn;
  uint32_t global = 0;  // pool slot
  uint32_t local = 0;   // the client's slot
  Method method = Method::kVecop;
  uint32_t len = 0, resp_len = 0;
};

struct OrchestratorConfig {
  Mode mode = Mode::kCpu;
  uint32_t max_batch = 16;
  Duration work_timeout = std::chrono::seconds(10);
};

class Orchestrator {
 public:
  using Finish = std::function<void(Job& job, const Status& status)>;
  virtual ~Orchestrator() = default;
  static Result<std::unique_ptr<Orchestrator>> create(const OrchestratorConfig& config, const Pool& pool,
                                                      Finish finish);
  virtual void submit(Job job) = 0;
  virtual void stop() = 0;
};

// Factories of the two families (orch_cpu.cc, orch_doorbell.cc).
Result<std::unique_ptr<Orchestrator>> make_cpu_orchestrator(const OrchestratorConfig& config, const Pool& pool,
                                                            Orchestrator::Finish finish);
Result<std::unique_ptr<Orchestrator>> make_doorbell_orchestrator(const OrchestratorConfig& config,
                                                                 const Pool& pool, Orchestrator::Finish finish);

}  // namespace dmx::rpc
