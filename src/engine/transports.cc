#include "engine/transports.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <mutex>

#include "core/config.h"
#include "core/log.h"
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/devmem/devmem_transport.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace dmx {

namespace {

std::mutex added_mu;
std::vector<std::function<std::shared_ptr<Transport>()>>& added() {
  static auto* list = new std::vector<std::function<std::shared_ptr<Transport>()>>;  // never destroyed
  return *list;
}

}  // namespace

// cuda_ipc first: it moves device memory at the link's speed and never stages; devmem next (the
// NIC reads and writes device memory); rdma next (between hosts only, unless forced: its compatible()
// refuses one host, where shm and cuda_ipc do better); shm carries every kind, staging device memory; tcp last:
// what no path carries goes inline on the streams.
TransportList default_transports() {
  TransportList list{make_cuda_ipc_transport(), make_devmem_transport(), make_rdma_transport(), make_shm_transport(),
                     make_shm_pipe_transport(), make_tcp_transport()};
  std::lock_guard<std::mutex> lock(added_mu);
  for (const auto& make : added()) register_transport(list, make());
  return list;
}

void add_transport(std::function<std::shared_ptr<Transport>()> make) {
  std::lock_guard<std::mutex> lock(added_mu);
  added().push_back(std::move(make));
}

Status check_transport_setting(const TransportList& list, const std::string& name, const std::string& source) {
  if (name == "auto") return Status();
  std::vector<std::string> choices{"auto"};
  for (const auto& t : list) {
    if (t->gives() == Gives::kControl) continue;
    if (t->name() == name) return Status();
    choices.emplace_back(t->name());
  }
  return Status(Code::kInvalidArgument, fmt::format("setting transport ({}): '{}' is not one of {}{}", source,
                                                    printable(name, 64), fmt::join(choices, "|"),
                                                    did_you_mean(name, choices)));
}

std::vector<std::string> metric_names(const TransportList& list) {
  std::vector<std::string> out;
  for (const auto& t : list)
    if (t->gives() == Gives::kStreams) out.emplace_back(t->metric_name());
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
