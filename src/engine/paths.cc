#include "engine/paths.h"

#include <fmt/format.h>

#include <thread>

#include "core/units.h"
#include "engine/devmem_path.h"
#include "engine/ipc_path.h"
#include "memory/backend.h"
#include "transport/shm/shm.h"

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
  // The payload paths beside the streams: when negotiate() picks each, and whether this host can
  // offer it now (the reason when not).
  std::string forced = c.get_string("transport");
  auto line = [&](const char* name, bool allowed, const Status& offer, const std::string& when) {
    std::string state = !allowed ? fmt::format("not offered: transport={}", forced)
                        : offer.ok() ? "offered by this host"
                                     : "not offered: " + offer.message();
    return Capability{fmt::format("engine.path.{}", name), allowed && offer.ok(), fmt::format("{}; {}", state, when)};
  };
  auto allowed = [&](std::string_view p) { return forced == "auto" || forced == p; };
  out.push_back(line("devmem", allowed("devmem"), devmem_path_offer(c),
                     "chosen when both peers offer it and are on different hosts (or transport=devmem): payloads "
                     "from device memory into buffers its gatherer writes go on a dedicated data socket, the rest "
                     "inline; docs/devmem.md"));
  out.push_back(line("shm", allowed("shm"), shm::available(),
                     "chosen between two processes of one host (same boot id and hostname) when both offer it and "
                     "the side channel connects"));
  out.push_back(line("cuda_ipc", allowed("cuda_ipc"), cuda_ipc_path_available(),
                     "chosen between two processes of one host with CUDA; carries device sources"));
  return out;
}

}  // namespace dmx
