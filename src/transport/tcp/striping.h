// Striping over the TCP data streams (1..N beside the control stream 0): a message too small to
// give every data stream a chunk_size chunk goes in host_chunk_size pieces when it is host memory;
// a stream more than one chunk ahead of the least loaded (chunks taken and not yet written) leaves
// the next to it; a new transfer wakes as many streams as it has chunks, least loaded first.
#pragma once

#include <memory>

#include "transport/striping.h"

namespace dmx::tcp {

// For an endpoint of more than one stream.
std::unique_ptr<Striping> make_striping(StripingSetup setup);

}  // namespace dmx::tcp
