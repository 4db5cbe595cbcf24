// The cuda_ipc payload path (placeholder until written): see payload_path.h.
#pragma once

#include <memory>
#include <string>

#include "core/config.h"
#include "engine/payload_path.h"

namespace dmx {

// Whether this process can offer cuda_ipc (CUDA build, driver, a GPU), or why not.
Status cuda_ipc_path_available();
// `peer`: names the peer in messages and keys the import cache.
Result<std::unique_ptr<PayloadPath>> make_cuda_ipc_path(const Config& config, std::string peer);

}  // namespace dmx
