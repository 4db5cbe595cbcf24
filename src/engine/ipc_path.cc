#include "engine/ipc_path.h"

namespace dmx {

Status cuda_ipc_path_available() { return Status(Code::kUnavailable, "the cuda_ipc payload path is not written yet"); }

Result<std::unique_ptr<PayloadPath>> make_cuda_ipc_path(const Config&, std::string) {
  return Status(Code::kUnavailable, "the cuda_ipc payload path is not written yet");
}

}  // namespace dmx
