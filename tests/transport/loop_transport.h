// A test-only transport, "loop": between two endpoints of one process, the receiver copies each
// chunk straight out of the sender's host memory (the descriptor carries the address); it takes
// lists too, so the conformance suite's vectored writes go as table chunks over it. It lives
// only here and is registered from the tests (ContextImpl::register_transport): adding a
// transport takes its own files and one registration, and the conformance suite then runs over
// it like over any other.
#pragma once

#include <memory>
#include <string>

#include "transport/transport.h"

namespace dmx::test {

// `name`: another name for the same transport (tests of the ranking play a transport they do not
// have, such as "rdma", with it).
std::shared_ptr<Transport> make_loop_transport(std::string name = "loop");

// The next `n` chunks the loop path moves land with one bit flipped (checksum tests).
void corrupt_loop_chunks(int n);

}  // namespace dmx::test
