#include "engine/paths.h"

#include <fmt/format.h>

#include <thread>

#include "core/units.h"
#include "memory/backend.h"

namespace dmx {

std::vector<Capability> probe_engine_paths(const Config& c) {
  std::vector<Capability> out;
  auto gpus = cuda_device_count();
  Capability tcp{"engine.path.tcp", true,
                 fmt::format("staged TCP: {} streams, {} chunks; device memory {}", c.get_int("streams"),
                             format_size(c.get_size("chunk_size")),
                             gpus.ok() ? fmt::format("({} CUDA device(s)) staged through pinned slots on copy engines", *gpus)
                                       : "unavailable (" + gpus.status().message() + "); host and sim memory only")};
  bool default_poll = false;
  for (const auto& item : c.items())
    if (item.entry->name == "busy_poll") default_poll = item.source == "default";
  unsigned cpus = std::thread::hardware_concurrency();
  std::string poll = default_poll && cpus < 8
                         ? fmt::format("0 (default adapted: {} CPUs; spinning would starve other threads)", cpus)
                         : fmt::format("{} us", c.get_duration("busy_poll").count());
  tcp.facts = {{"auth", c.get_bool("insecure") ? "off (insecure)" : "HMAC-SHA256 shared key"},
               {"busy_poll", poll},
               {"transport_setting", c.get_string("transport")}};
  out.push_back(std::move(tcp));
  // Paths whose data layers exist (tested on their own) but which negotiate() does not offer yet.
  out.push_back({"engine.path.devmem", false,
                 "not chosen by the engine yet: the devmem data path (src/transport/devmem) is not wired into "
                 "endpoints; see the devmem.* lines for what this host's kernel and NICs allow"});
  out.push_back({"engine.path.shm", false,
                 "not chosen by the engine yet: the shared-memory data path (src/transport/shm) is not wired into "
                 "endpoints; same-host peers use tcp over loopback"});
  out.push_back({"engine.path.cuda_ipc", false,
                 "not chosen by the engine yet: the CUDA IPC data path (src/transport/cuda_ipc) is not wired into "
                 "endpoints; same-host GPU peers are staged over tcp"});
  return out;
}

}  // namespace dmx
