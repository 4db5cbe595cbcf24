// python/src/log.h — dmx's log lines into Python's logging (the logger "dmx").
//
// dmx threads never run Python code: the handler installed by log_start queues each line (at most
// kMaxLines, each cut at kMaxLineBytes; beyond, lines are counted and dropped, and the count is
// reported), and a Python thread (dmx/_log.py) takes them with log_take and hands them to
// logging. log_stop puts stderr back. Thread-safe; call these with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>
#include <string>

namespace dmxpy {

// Routes dmx's lines to the queue; `after_fork`: in a forked child, with a fresh queue.
void log_start(bool after_fork);
// Waits up to `timeout` seconds (GIL released) for lines; returns them as a list of (levelno,
// message, time.time() of the line), possibly empty; None once log_stop ran and nothing is left.
pybind11::object log_take(double timeout);
// Puts stderr back and wakes log_take.
void log_stop();
// The log_level setting that matches the effective level of logging.getLogger("dmx").
std::string python_log_level();

}  // namespace dmxpy
