#include "engine/transports.h"

#include <algorithm>

#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/devmem/devmem_transport.h"
#include "transport/shm/shm_transport.h"

namespace dmx {

// cuda_ipc first: it moves device memory at the link's speed and never stages; devmem next (the
// NIC reads and writes device memory); shm carries every kind, staging device memory.
TransportList default_transports() {
  return {make_cuda_ipc_transport(), make_devmem_transport(), make_shm_transport(), make_shm_pipe_transport()};
}

std::vector<std::string> metric_names(const TransportList& list) {
  std::vector<std::string> out{"tcp"};
  for (const auto& t : list)
    if (std::find(out.begin(), out.end(), t->metric_name()) == out.end()) out.emplace_back(t->metric_name());
  return out;
}

void register_transport(TransportList& list, std::shared_ptr<Transport> t) {
  for (auto& have : list)
    if (have->name() == t->name()) {
      have = std::move(t);
      return;
    }
  list.push_back(std::move(t));
}

}  // namespace dmx
