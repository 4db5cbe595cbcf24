#include "transport/transport.h"

namespace dmx {

bool transport_allowed(const Config& config, std::string_view name) {
  std::string forced = config.get_string("transport");
  return forced == "auto" || forced == name;
}

}  // namespace dmx
