// Latency trace: timestamps at named points of the small-message path, for finding where the
// microseconds of a ping-pong go. Compiled in only with -DDMX_TRACE=ON (the macro is empty
// otherwise) and recording only when DMX_TRACE_FILE names a file: each process then maps
// FILE.<pid> and appends (monotonic ns, thread id, point name) records to it. The file is a shared
// mapping, so the records survive a process that is killed; scripts/trace-report.py merges the
// files of both sides of a run and prints the median time between consecutive points.
#pragma once

//
// The throughput path's stages (scripts/stage-times.py) are named per stream: DMX_TRACE_AT(name,
// id) records "<name>@<id>", DMX_TRACE_SPAN(name, id, t0) the two adjacent records "<name>+<id>" at
// t0 (a steady_clock time point, CLOCK_MONOTONIC) and "<name>-<id>" now; <id> is 6 hex digits of
// the pointer `id` (the stream). Names at most 11 characters.
#if defined(DMX_TRACE_ENABLED)
#include <chrono>

namespace dmx::trace {
void point(const char* name);  // `name`: a string literal, at most 19 characters are kept
void at(const char* name, const void* id);
void span(const char* name, const void* id, std::chrono::steady_clock::time_point t0);
}  // namespace dmx::trace
#define DMX_TRACE_POINT(name) ::dmx::trace::point(name)
#define DMX_TRACE_AT(name, id) ::dmx::trace::at(name, id)
#define DMX_TRACE_SPAN(name, id, t0) ::dmx::trace::span(name, id, t0)
#else
#define DMX_TRACE_POINT(name) \
  do {                        \
  } while (0)
#define DMX_TRACE_AT(name, id) \
  do {                         \
  } while (0)
#define DMX_TRACE_SPAN(name, id, t0) \
  do {                               \
  } while (0)
#endif
