// Without CUDA: GPU workers are unavailable, with the reason.
#include "mqueue/gpu_workers.h"

namespace dmx::mqueue {

struct GpuWorkers::Impl {};
struct GpuLauncher::Impl {};

Status gpu_workers_available(int) {
  return Status(Code::kUnavailable, "mqueue GPU workers: dmx was built without CUDA (DMX_ENABLE_CUDA=OFF)");
}
Result<std::unique_ptr<GpuWorkers>> GpuWorkers::start(QueueSet*, AppKind, uint32_t) { return gpu_workers_available(0); }
GpuWorkers::GpuWorkers(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuWorkers::~GpuWorkers() = default;
Status GpuWorkers::stop(Duration) { return Status(); }
Result<std::unique_ptr<WorkerWriter>> make_stream_writer(int) { return gpu_workers_available(0); }
Result<std::unique_ptr<GpuLauncher>> GpuLauncher::create(int) { return gpu_workers_available(0); }
GpuLauncher::GpuLauncher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuLauncher::~GpuLauncher() = default;
Status GpuLauncher::run_xor(const void*, void*, uint32_t, Duration) { return gpu_workers_available(0); }

}  // namespace dmx::mqueue
