// Built without CUDA: the CUDA gatherer says why it is unavailable.
#include "transport/devmem/gather.h"

namespace dmx::devmem {

Result<std::unique_ptr<Gatherer>> make_cuda_gatherer(int) {
  return Status(Code::kUnavailable, "devmem GPU gather: this dmx was built without CUDA (DMX_ENABLE_CUDA=OFF)");
}

}  // namespace dmx::devmem
