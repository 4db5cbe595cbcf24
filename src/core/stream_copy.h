// A copy whose stores bypass the cache, for destinations not read again soon: the processor then
// writes each line once, without first reading it (a read for ownership), which saves a third of
// the memory traffic of a large copy.
#pragma once

#include <cstddef>

namespace dmx {

// Copies n bytes like memcpy, with non-temporal stores where the processor has them.
void stream_copy(void* dst, const void* src, size_t n);

}  // namespace dmx
