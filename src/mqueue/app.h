// mqueue/app.h — what a worker computes for a request, on the CPU (the GPU kernel in
// cuda/kernel.cu implements the same AppKinds).
//
// An AppFn runs on its worker's thread only. It reads the request, writes the response into
// `resp` (at most resp.size() bytes) and returns the response length; an error becomes an error
// response (kErrorMagic on the wire) naming it. It may call the external service through
// `calls` (nullptr where the server has no client queues).
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "dmx/request.h"
#include "dmx/status.h"
#include "mqueue/layout.h"

namespace dmx::mqueue {

// A worker's client queue to one external service.
class CallPort {
 public:
  virtual ~CallPort() = default;
  // Sends `req`, waits up to `timeout` for the reply and copies it into `reply`; the reply length.
  // kTimeout, kPeerFailed (the service failed), kTruncated (reply larger than `reply`).
  virtual Result<size_t> call(std::span<const uint8_t> req, std::span<uint8_t> reply, Duration timeout) = 0;
};

using AppFn = std::function<Result<size_t>(std::span<const uint8_t> req, std::span<uint8_t> resp, CallPort* calls)>;

// The CPU implementation of `kind`; max_call bounds a call reply (Geometry::max_call).
AppFn cpu_app(AppKind kind, Duration call_timeout, uint32_t max_call);

// Face verification's verdict, the same on CPU and GPU.
inline bool face_match(uint64_t distance, uint64_t image_len, uint64_t ref_len) {
  return image_len == ref_len && distance <= image_len * kFaceMatchMeanDiff;
}

}  // namespace dmx::mqueue
