#include "engine/paths.h"

#include <fmt/format.h>

#include "core/sys.h"
#include "core/units.h"
#include "engine/transports.h"
#include "memory/backend.h"

namespace dmx {

std::vector<Capability> probe_engine_paths(const Config& c) {
  std::vector<Capability> out;
  auto gpus = cuda_device_count();
  Capability streams{
      "engine.streams", true,
      fmt::format("{} data streams, {} chunks; device memory {}", c.get_int("streams"),
                  format_size(c.get_size("chunk_size")),
                  gpus.ok() ? fmt::format("({} CUDA device(s)) staged through pinned slots on copy engines", *gpus)
                            : "unavailable (" + gpus.status().message() + "); host and sim memory only")};
  bool default_poll = false;
  for (const auto& item : c.items())
    if (item.entry->name == "busy_poll") default_poll = item.source == "default";
  std::string cpus_found;
  unsigned cpus = usable_cpus(&cpus_found);
  std::string poll = default_poll && cpus < 8
                         ? fmt::format("0 (default adapted: {} usable CPUs; spinning would starve other threads)", cpus)
                         : fmt::format("{} us", c.get_duration("busy_poll").count());
  streams.facts = {{"auth", c.get_bool("insecure") ? "off (insecure)" : "HMAC-SHA256 shared key"},
                   {"busy_poll", poll},
                   {"cpus", cpus_found},
                   {"transport_setting", c.get_string("transport")}};
  out.push_back(std::move(streams));
  // The transports, in the registry's order: whether this host offers each
  // now (the reason when not) and when the engine uses it.
  for (const auto& t : default_transports()) {
    auto offer = t->offer(c);
    std::string state = offer.ok() ? "offered by this host" : "not offered: " + offer.status().message();
    out.push_back(Capability{fmt::format("engine.path.{}", t->name()), offer.ok(), fmt::format("{}; {}", state, t->when())});
  }
  return out;
}

}  // namespace dmx
