#include "errors.h"

#include <cmath>
#include <string>

namespace py = pybind11;

namespace dmxpy {

[[noreturn]] void raise_status(const dmx::Status& status) {
  // Looked up at each error (errors are not the fast path); the module is cached by Python.
  py::object make = py::module_::import("dmx._errors").attr("_from_status");
  py::object exc = make(static_cast<int>(status.code()), status.message(), status.origin(),
                        status.peer(), status.to_string());
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

dmx::Duration to_duration(std::optional<double> seconds, const char* what) {
  if (!seconds) return dmx::kForever;
  double s = *seconds;
  if (std::isnan(s) || s < 0)
    raise_error(dmx::Code::kInvalidArgument, std::string(what) + ": expected seconds >= 0 or None, got " +
                                                 std::to_string(s));
  // Past ~292 years the nanosecond count overflows: that is forever.
  if (s >= 9e9) return dmx::kForever;
  return std::chrono::duration_cast<dmx::Duration>(std::chrono::duration<double>(s));
}

}  // namespace dmxpy
