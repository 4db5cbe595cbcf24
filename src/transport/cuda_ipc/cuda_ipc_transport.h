// The cuda_ipc transport: device sources copied by the receiver out of the sender's GPU memory
// (ipc_path.h), for two processes of one host, or two endpoints of one process.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace dmx {

std::shared_ptr<Transport> make_cuda_ipc_transport();

}  // namespace dmx
