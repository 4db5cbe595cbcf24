// Test hooks of the simulated device (sim_backend.cc).
#pragma once

#include <cstdint>

namespace dmx {

// "A persistent kernel runs on every sim device": while busy, the sim backend's calls that wait
// for an idle device (free, free_staging: as cudaFree and cudaFreeHost; cudaHostUnregister too,
// which dmx no longer calls) block (up to two minutes each) and hold the simulated driver lock meanwhile, which
// every other sim backend and queue call waits for (as libcuda's process-wide lock does).
void sim_hold_device_busy(bool busy);
// How many sim calls have waited for a busy device so far.
uint64_t sim_idle_waits();
// Sim queues refuse copy_list (kUnavailable, nothing enqueued) while set, as a CUDA queue whose
// kernels cannot load on its device: callers must copy span by span.
void sim_refuse_lists(bool refuse);

}  // namespace dmx
