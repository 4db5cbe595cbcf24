// rpc/service.h — the example service's methods, on host memory (the GPU versions live in
// rpc/cuda/device.h and compute the same bytes for vecop; mlp agrees to float rounding).
//
// vecop: an element-wise byte op, out[i] = in[i] * 7 + (i * 131 + 17) (mod 256); any length.
// mlp:   a two-layer perceptron per sample: 64 float32 in -> 64 hidden (ReLU) -> 16 float32 out;
//        the request is a whole number of 256-byte samples, the response 64 bytes per sample.
// Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dmx/status.h"
#include "rpc/header.h"

namespace dmx::rpc {

inline constexpr int kMlpIn = 64, kMlpHidden = 64, kMlpOut = 16;
inline constexpr size_t kMlpSampleIn = kMlpIn * 4, kMlpSampleOut = kMlpOut * 4;

// The response length for a request of `len` bytes, or kInvalidArgument saying why not.
Result<uint32_t> response_size(Method method, uint32_t len);

// Computes the response into `out` (response_size bytes); `in` and `out` may not overlap.
void run_host(Method method, const unsigned char* in, size_t len, unsigned char* out);

// The fixed MLP weights, the same on host and device: W1 [hidden][in], b1, W2 [out][hidden], b2.
struct MlpWeights {
  float w1[kMlpHidden][kMlpIn];
  float b1[kMlpHidden];
  float w2[kMlpOut][kMlpHidden];
  float b2[kMlpOut];
};
const MlpWeights& mlp_weights();

}  // namespace dmx::rpc
