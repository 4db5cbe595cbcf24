// The shm transports: payloads through a shared-memory slot ring (shm_path.h), and stream 0 on a
// shared-memory pipe (control_pipe.h). Both are for two processes of one host.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace dmx {

std::shared_ptr<Transport> make_shm_transport();
// "shm_pipe": offered unless transport is tcp or devmem, or control_pipe is off.
std::shared_ptr<Transport> make_shm_pipe_transport();

}  // namespace dmx
