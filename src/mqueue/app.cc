#include "mqueue/app.h"

#include <cstring>
#include <string>
#include <vector>

namespace dmx::mqueue {
namespace {

Result<size_t> xor_app(std::span<const uint8_t> req, std::span<uint8_t> resp) {
  if (req.size() > resp.size())
    return Status(Code::kOutOfRange, "xor: request of " + std::to_string(req.size()) + " B over the response limit");
  for (size_t i = 0; i < req.size(); ++i) resp[i] = req[i] ^ kXorKey;
  return req.size();
}

Result<size_t> face_app(std::span<const uint8_t> req, std::span<uint8_t> resp, CallPort* calls, Duration timeout,
                        std::vector<uint8_t>& ref) {
  if (req.size() < 4) return Status(Code::kInvalidArgument, "face: request shorter than its 4-byte id");
  if (resp.size() < 8) return Status(Code::kOutOfRange, "face: response limit under 8 B");
  if (calls == nullptr) return Status(Code::kUnavailable, "face: this server has no client queues");
  DMX_ASSIGN_OR_RETURN(size_t ref_len, calls->call(req.first(4), ref, timeout));
  std::span<const uint8_t> image = req.subspan(4);
  uint64_t dist = 0;
  size_t n = std::min(image.size(), ref_len);
  for (size_t i = 0; i < n; ++i) dist += image[i] > ref[i] ? image[i] - ref[i] : ref[i] - image[i];
  uint32_t out[2] = {face_match(dist, image.size(), ref_len) ? 1u : 0u,
                     static_cast<uint32_t>(std::min<uint64_t>(dist, UINT32_MAX))};
  std::memcpy(resp.data(), out, 8);
  return size_t{8};
}

}  // namespace

AppFn cpu_app(AppKind kind, Duration call_timeout, uint32_t max_call) {
  if (kind == AppKind::kFaceVerify) {
    return [call_timeout, max_call](std::span<const uint8_t> req, std::span<uint8_t> resp, CallPort* calls) {
      thread_local std::vector<uint8_t> ref;  // each worker thread its own
      ref.resize(max_call);
      return face_app(req, resp, calls, call_timeout, ref);
    };
  }
  return [](std::span<const uint8_t> req, std::span<uint8_t> resp, CallPort*) { return xor_app(req, resp); };
}

}  // namespace dmx::mqueue
