#include "rpc/orchestrator.h"

#include <string>

namespace dmx::rpc {

Result<Mode> parse_mode(std::string_view text) {
  if (text == "cpu") return Mode::kCpu;
  if (text == "batch") return Mode::kBatch;
  if (text == "gpu") return Mode::kGpu;
  if (text == "graph") return Mode::kGraph;
  return Status(Code::kInvalidArgument, "rpc mode '" + std::string(text) + "': expected cpu, batch, gpu or graph");
}

std::string_view mode_name(Mode mode) {
  switch (mode) {
    case Mode::kCpu: return "cpu";
    case Mode::kBatch: return "batch";
    case Mode::kGpu: return "gpu";
    case Mode::kGraph: return "graph";
  }
  return "?";
}

Result<std::unique_ptr<Orchestrator>> Orchestrator::create(const OrchestratorConfig& config, const Pool& pool,
                                                           Finish finish) {
  if (config.max_batch == 0 || config.max_batch > 1024)
    return Status(Code::kInvalidArgument, "rpc: max_batch must be 1-1024");
  if (config.mode == Mode::kGpu) return make_doorbell_orchestrator(config, pool, std::move(finish));
  return make_cpu_orchestrator(config, pool, std::move(finish));
}

}  // namespace dmx::rpc
