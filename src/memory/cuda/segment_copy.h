// Segment copy: many (src, dst, len) copies between device pointers (this GPU's memory, a peer
// GPU's by P2P or a CUDA IPC mapping) in one kernel launch, for vectored transfers of thousands
// of KV-cache blocks where one cudaMemcpyAsync per block costs more than the copy.
//
// No CUDA includes here (CPU code calls it); built only with CUDA (in dmx_memory: CUDA copy queues gather and scatter with it). The
// caller validates every segment against its regions before it launches: the kernel trusts the
// descriptors.
#pragma once

#include <cstdint>

#include "dmx/status.h"

namespace dmx::cuda {

struct SegmentCopy {
  uint64_t src;  // device addresses
  uint64_t dst;
  uint64_t len;
};
static_assert(sizeof(SegmentCopy) == 24);

// The largest segment one descriptor should carry: one warp copies one descriptor, so a longer
// segment is cut into pieces of this size by split_segment (the warps then share it).
inline constexpr uint64_t kSegmentPiece = 64 << 10;

// Appends [src, +len) -> [dst, +len) to `out` as pieces of at most `piece` bytes (> 0); returns
// how many it wrote (out must have room for (len + piece - 1) / piece).
inline uint64_t split_segment(uint64_t src, uint64_t dst, uint64_t len, SegmentCopy* out,
                              uint64_t piece = kSegmentPiece) {
  uint64_t n = 0;
  for (uint64_t at = 0; at < len; at += piece, ++n)
    out[n] = SegmentCopy{src + at, dst + at, len - at < piece ? len - at : piece};
  return n;
}

// Launches the copy of `n` descriptors at `descs` (device-readable memory) on `stream` (a
// cudaStream_t of the current device; nullptr: the legacy stream). Warps stride over the
// descriptors; each copies with the widest words its two addresses' alignment allows (16, 8, 4
// or 1 bytes), four loads in flight per lane. Returns the launch status only.
Status launch_segment_copy(const SegmentCopy* descs, uint64_t n, void* stream);

// Loads the kernel on the current device now, not at its first launch (push.h says why).
Status preload_segment_copy();

}  // namespace dmx::cuda
