// Joins threads that cannot be joined by their owner because the owner is being destroyed on that
// very thread (a worker that dropped the last reference to the object that owns it). Instead of
// detaching, such a thread hands itself to the reaper, which joins it on its own thread.
//
// Contract: hand over only a thread that is finishing — the caller is that thread, in its last
// steps, and touches nothing of the destroyed owner afterwards — so a join by the reaper waits
// only for those steps. Thread-safe. The reaper thread starts when first handed a thread (again
// in a forked child); at process exit (static destruction) it joins every thread handed to it and
// then itself, before the logger is destroyed, so no dmx thread outlives main's statics. A thread
// handed over after that (one that finished while the process was already exiting) is detached:
// nothing is left to join it, and a joinable handle would end the process in std::terminate.
#pragma once

#include <cstddef>
#include <thread>

namespace dmx {

// Joins `t` here when the caller is another thread; otherwise (the caller is `t`) hands it to the
// reaper. A non-joinable `t` is left alone.
void join_or_reap(std::thread& t);

// Threads handed to the reaper that it has not joined yet (for tests).
size_t reaper_pending();

}  // namespace dmx
