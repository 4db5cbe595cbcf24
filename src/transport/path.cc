#include "transport/path.h"

#include <fmt/format.h>

namespace dmx {


Result<uint64_t> decode_length_descriptor(std::span<const unsigned char> d, uint64_t max, std::string_view path,
                                          const std::string& peer) {
  if (d.size() != kLengthDescriptorSize)
    return Status(Code::kProtocol, fmt::format("{} path: a chunk descriptor of {} B from peer {} (expected {} B)", path,
                                               d.size(), peer, kLengthDescriptorSize))
        .with_peer(peer);
  uint64_t n = 0;
  for (size_t i = 0; i < kLengthDescriptorSize; ++i) n |= uint64_t{d[i]} << (8 * i);
  if (n > max)
    return Status(Code::kProtocol,
                  fmt::format("{} path: peer {} announced a chunk of {} B (at most {} B)", path, peer, n, max))
        .with_peer(peer);
  return n;
}

}  // namespace dmx
