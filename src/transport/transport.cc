#include "transport/transport.h"

#include <fmt/format.h>

namespace dmx {

bool transport_allowed(const Config& config, std::string_view name) {
  std::string forced = config.get_string("transport");
  return forced == "auto" || forced == name;
}

Status same_version(std::string_view name, std::span<const unsigned char> a, std::span<const unsigned char> b,
                    unsigned char version) {
  if (a.size() != 1 || b.size() != 1 || a[0] != version || b[0] != version)
    return Status(Code::kUnavailable, fmt::format("{}: the peers speak different versions of it", name));
  return Status();
}

}  // namespace dmx
