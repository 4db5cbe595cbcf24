#include "engine/payload_path.h"

namespace dmx {

const char* path_name(PathKind k) {
  switch (k) {
    case PathKind::kShm: return "shm";
    case PathKind::kCudaIpc: return "cuda_ipc";
    case PathKind::kDevmem: return "devmem";
  }
  return "?";
}

}  // namespace dmx
