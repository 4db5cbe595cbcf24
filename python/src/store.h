// python/src/store.h — the store methods of dmx.Context (docs/cluster.md): publish, lookup,
// lookup_peer, cluster, epoch. Added to the class module.cc defines.
#pragma once

#include <pybind11/pybind11.h>

#include <functional>

#include "dmx/dmx.h"

namespace dmxpy {

void add_store(pybind11::module_& m, std::function<dmx::Context&(pybind11::handle)> context_of,
               std::function<const dmx::Registration&(pybind11::handle)> registration_of);

}  // namespace dmxpy
