// Latency trace: timestamps at named points of the small-message path, for finding where the
// microseconds of a ping-pong go. Compiled in only with -DDMX_TRACE=ON (the macro is empty
// otherwise) and recording only when DMX_TRACE_FILE names a file: each process then maps
// FILE.<pid> and appends (monotonic ns, thread id, point name) records to it. The file is a shared
// mapping, so the records survive a process that is killed; scripts/trace-report.py merges the
// files of both sides of a run and prints the median time between consecutive points.
#pragma once

#if defined(DMX_TRACE_ENABLED)
namespace dmx::trace {
void point(const char* name);  // `name`: a string literal, at most 19 characters are kept
}  // namespace dmx::trace
#define DMX_TRACE_POINT(name) ::dmx::trace::point(name)
#else
#define DMX_TRACE_POINT(name) \
  do {                        \
  } while (0)
#endif
