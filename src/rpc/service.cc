#include "rpc/service.h"

#include <cstring>
#include <string>

namespace dmx::rpc {
namespace {

MlpWeights make_weights() {
  MlpWeights w{};
  uint32_t x = 12345;  // a fixed LCG, so host, device and any peer agree on the weights
  auto next = [&x] {
    x = x * 1664525u + 1013904223u;
    return static_cast<float>((x >> 8) & 0xffff) / 65536.0f - 0.5f;
  };
  for (auto& row : w.w1)
    for (float& v : row) v = next() * 0.25f;
  for (float& v : w.b1) v = next() * 0.1f;
  for (auto& row : w.w2)
    for (float& v : row) v = next() * 0.25f;
  for (float& v : w.b2) v = next() * 0.1f;
  return w;
}

void mlp_sample(const MlpWeights& w, const float* in, float* out) {
  float h[kMlpHidden];
  for (int j = 0; j < kMlpHidden; ++j) {
    float s = w.b1[j];
    for (int i = 0; i < kMlpIn; ++i) s += w.w1[j][i] * in[i];
    h[j] = s > 0 ? s : 0;
  }
  for (int k = 0; k < kMlpOut; ++k) {
    float s = w.b2[k];
    for (int j = 0; j < kMlpHidden; ++j) s += w.w2[k][j] * h[j];
    out[k] = s;
  }
}

}  // namespace

const MlpWeights& mlp_weights() {
  static const MlpWeights w = make_weights();
  return w;
}

Result<uint32_t> response_size(Method method, uint32_t len) {
  switch (method) {
    case Method::kVecop: return len;
    case Method::kMlp:
      if (len % kMlpSampleIn != 0)
        return Status(Code::kInvalidArgument, "mlp: request of " + std::to_string(len) +
                                                  " bytes is not a whole number of 256-byte samples");
      return static_cast<uint32_t>(len / kMlpSampleIn * kMlpSampleOut);
  }
  return Status(Code::kInvalidArgument, "unknown method");
}

void run_host(Method method, const unsigned char* in, size_t len, unsigned char* out) {
  if (method == Method::kVecop) {
    for (size_t i = 0; i < len; ++i)
      out[i] = static_cast<unsigned char>(in[i] * 7u + static_cast<unsigned>(i) * 131u + 17u);
    return;
  }
  const MlpWeights& w = mlp_weights();
  for (size_t s = 0; s < len / kMlpSampleIn; ++s) {
    float x[kMlpIn], y[kMlpOut];
    std::memcpy(x, in + s * kMlpSampleIn, sizeof x);  // payload bytes need not be float-aligned
    mlp_sample(w, x, y);
    std::memcpy(out + s * kMlpSampleOut, y, sizeof y);
  }
}

}  // namespace dmx::rpc
