// A test-only transport, "loop": between two endpoints of one process, the receiver copies each
// chunk straight out of the sender's host memory (the descriptor carries the address). It lives
// only here and is registered from the tests (ContextImpl::register_transport): adding a
// transport takes its own files and one registration, and the conformance suite then runs over
// it like over any other.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace dmx::test {

std::shared_ptr<Transport> make_loop_transport();

// The next `n` chunks the loop path moves land with one bit flipped (checksum tests).
void corrupt_loop_chunks(int n);

}  // namespace dmx::test
