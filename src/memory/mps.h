// Whether a CUDA MPS control daemon serves this machine (CUDA-free: it looks for the daemon's
// control socket). Two processes that use one GPU without MPS each have their own context, and the
// GPU switches between the contexts whenever work alternates: on one H200 an 8-byte ping-pong
// between two processes measured 167 us per message without MPS and 17.9 us with it
// (docs/performance.md, "Two processes on one GPU"). With MPS both processes' work runs in one
// shared context.
#pragma once

#include <string>

#include "dmx/status.h"

namespace dmx {

// The control socket's path when it exists ($CUDA_MPS_PIPE_DIRECTORY/control, default
// /tmp/nvidia-mps/control); kUnavailable saying where it looked otherwise.
Result<std::string> cuda_mps_daemon();

}  // namespace dmx
