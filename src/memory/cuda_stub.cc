// Built when dmx is configured without CUDA: every CUDA kind says why it is unavailable.
#include "memory/backend.h"
#include "memory/cumem.h"

namespace dmx {

static Status no_cuda() { return Status(Code::kUnavailable, "this dmx was built without CUDA (DMX_ENABLE_CUDA=OFF)"); }

Result<MemoryBackend*> cuda_backend(int) { return no_cuda(); }
Result<MemoryBackend*> pinned_backend() { return no_cuda(); }
Result<int> cuda_device_count() { return no_cuda(); }
Result<void*> cuda_cumem_alloc(int, size_t, size_t) {
  return no_cuda();
}
Result<void*> cuda_cumem_alloc_owner_only(int, size_t) {
  return no_cuda();
}
void cuda_cumem_free(void*) {}
Status cuda_cumem_ipc_supported(int) {
  return no_cuda();
}

}  // namespace dmx
