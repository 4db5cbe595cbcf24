// The TCP transport: every chunk no path carries rides the endpoint's streams, striped over its
// data streams (the `streams` setting; beside more than one, stream 0 is a control stream). The
// streams themselves are the engine's (src/stream/): this transport is what offers them as a way
// for payload, names it in the handshake and in statistics, says when it is used, and decides how
// chunks spread over the data streams (striping.h).
#pragma once

#include <memory>

#include "transport/transport.h"

namespace dmx {

// "tcp": offered unless the transport setting names another transport; compatible with any peer.
std::shared_ptr<Transport> make_tcp_transport();

}  // namespace dmx
