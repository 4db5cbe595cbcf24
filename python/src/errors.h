// python/src/errors.h — dmx::Status as Python exceptions (dmx.Error and its subclasses).
//
// Call with the GIL held. The exception classes live in dmx/_errors.py; raise_status builds one
// from the Status (code, message, origin, peer) and throws it as pybind11::error_already_set.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <optional>

#include "dmx/request.h"
#include "dmx/status.h"

namespace dmxpy {

[[noreturn]] void raise_status(const dmx::Status& status);
[[noreturn]] inline void raise_error(dmx::Code code, std::string message) {
  raise_status(dmx::Status(code, std::move(message)));
}
inline void check(const dmx::Status& status) {
  if (!status.ok()) raise_status(status);
}
template <typename T>
T unwrap(dmx::Result<T>&& r) {
  if (!r.ok()) raise_status(r.status());
  return *std::move(r);
}

// A timeout in seconds from Python (None: forever); negative or NaN is an invalid argument.
dmx::Duration to_duration(std::optional<double> seconds, const char* what);

// Runs a blocking call in slices with the GIL released, checking for signals (Ctrl-C) between
// slices so that a wait without a deadline can still be interrupted. `attempt(slice)` returns
// true when done. Returns false when `total` passed first.
template <typename Attempt>
bool wait_in_slices(dmx::Duration total, Attempt attempt) {
  using Clock = std::chrono::steady_clock;
  constexpr dmx::Duration kSlice = std::chrono::milliseconds(100);
  const bool forever = total == dmx::kForever;
  const auto deadline = forever ? Clock::time_point::max() : Clock::now() + total;
  for (;;) {
    dmx::Duration slice = kSlice;
    if (!forever) {
      auto left = std::chrono::duration_cast<dmx::Duration>(deadline - Clock::now());
      if (left < slice) slice = left < dmx::Duration::zero() ? dmx::Duration::zero() : left;
    }
    bool done;
    {
      pybind11::gil_scoped_release nogil;
      done = attempt(slice);
    }
    if (done) return true;
    if (PyErr_CheckSignals() != 0) throw pybind11::error_already_set();
    if (!forever && Clock::now() >= deadline) return false;
  }
}

}  // namespace dmxpy
