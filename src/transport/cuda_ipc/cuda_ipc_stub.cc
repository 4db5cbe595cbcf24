// cuda_ipc without CUDA: everything says why it is unavailable.
#include "transport/cuda_ipc/cuda_ipc.h"

namespace dmx::cuda_ipc {
namespace {
Status no_cuda() {
  return Status(Code::kUnavailable, "cuda_ipc: this dmx was built without CUDA (DMX_ENABLE_CUDA=OFF)");
}
}  // namespace

Status available() { return no_cuda(); }
Exporter::~Exporter() = default;
Result<IpcDescriptor> Exporter::export_region(const MemRegion&) { return no_cuda(); }
Result<uint64_t> Exporter::forget(const void* ptr) { return no_cuda(); }
Result<UniqueFd> Exporter::export_fd(uint64_t) {
  return no_cuda();
}
size_t Exporter::sweep(size_t) {
  return 0;
}
Result<int> device_by_uuid(const std::array<uint8_t, 16>&) { return no_cuda(); }
Result<std::unique_ptr<CopyEngine>> CopyEngine::create(const Options&) { return no_cuda(); }
Result<std::unique_ptr<MappedWindow>> MappedWindow::open(const IpcDescriptor&, int) { return no_cuda(); }
MappedWindow::~MappedWindow() = default;

}  // namespace dmx::cuda_ipc
