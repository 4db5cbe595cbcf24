// The control pipe: stream 0 of a same-host endpoint on a shared-memory pipe (shm_transport.h).
#pragma once

#include <memory>

#include "core/clock.h"
#include "stream/conduit.h"
#include "transport/shm/shm.h"

namespace dmx {

// Bytes per direction: room for many control frames and a few inline payloads (eager_limit).
inline constexpr size_t kControlPipeBytes = 1 << 20;

// Makes the pipe over an authenticated side channel: the creator (the client) makes the shared
// region, the other side maps it.
Result<std::unique_ptr<stream::Conduit>> make_control_pipe(UnixChannel channel, bool creator, Deadline deadline);

}  // namespace dmx
