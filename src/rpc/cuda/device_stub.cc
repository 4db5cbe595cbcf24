// Without CUDA: the device side is unavailable, with the reason.
#include "rpc/cuda/device.h"

namespace dmx::rpc::device {
namespace {
Status no_cuda() {
  return Status(Code::kUnavailable, "rpc: built without CUDA (no nvcc at configure time): no GPU kernels");
}
}  // namespace

Result<std::unique_ptr<Launcher>> Launcher::create(int, bool) { return no_cuda(); }
Result<std::unique_ptr<Persistent>> Persistent::create(int, uint32_t) { return no_cuda(); }

}  // namespace dmx::rpc::device
