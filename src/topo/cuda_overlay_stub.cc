// Built without CUDA: the overlay says why it is absent.
#include "topo/topology.h"

namespace dmx::topo {

CudaOverlay query_cuda_overlay() {
  CudaOverlay o;
  o.reason = "this dmx was built without CUDA (DMX_ENABLE_CUDA=OFF)";
  return o;
}

}  // namespace dmx::topo
