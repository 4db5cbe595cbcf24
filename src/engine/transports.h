// The transports this engine can use, in order of preference: the only engine file that names
// one. Per chunk the endpoint takes the first agreed path, in this order, that carries the source
// and reaches the destination; the rest goes inline on the streams (the tcp transport).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace dmx {

using TransportList = std::vector<std::shared_ptr<Transport>>;

// A fresh registry for a new context: cuda_ipc, devmem, shm, shm_pipe, tcp, then those added
// with add_transport.
TransportList default_transports();

// Process-wide: every context created afterwards also has the transport `make` returns (tests:
// transports that live in the tests). Any thread.
void add_transport(std::function<std::shared_ptr<Transport>()> make);

// Whether `name` may be the transport setting: auto, or a transport of `list` that carries
// payload (a path, or the streams); kInvalidArgument naming `source` (where the value came from),
// the value, the choices and the nearest one when not.
Status check_transport_setting(const TransportList& list, const std::string& name, const std::string& source);

// The metrics rows: the streams' transport first (row 0: stream bytes and inline operations),
// then each transport's metric_name() once.
std::vector<std::string> metric_names(const TransportList& list);

// Puts `t` in place of the transport of its name, or last (tests: doubles and extra transports).
void register_transport(TransportList& list, std::shared_ptr<Transport> t);

}  // namespace dmx
