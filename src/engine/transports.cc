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
// what no path carries goes inline on the streams. Of the conduits for stream 0 the first agreed is
// used: rdma_ctl where rdma is, else shm_pipe on one host.
TransportList default_transports() {
  TransportList list{make_cuda_ipc_transport(), make_devmem_transport(), make_rdma_transport(),
                     make_rdma_ctl_transport(), make_shm_transport(), make_shm_pipe_transport(),
                     make_tcp_transport()};
  std::lock_guard<std::mutex> lock(added_mu);
  for (const auto& make : added()) register_transport(list, make());
  return list;
}

void add_transport(std::function<std::shared_ptr<Transport>()> make) {
  std::lock_guard<std::mutex> lock(added_mu);
  added().push_back(std::move(make));
}

// Counted per byte moved between a source and a destination buffer: the kernel's socket buffers
// are one host pass per side; a pinned staging slot is another, and a copy-engine copy each way.
// rdma is here before its registry line: a transport registered under that name (tests, or the
// transport itself) ranks by these.
TransportCosts transport_costs(std::string_view name) {
  TransportCosts c;
  c.known = true;
  if (name == "cuda_ipc") {
    c.same_host_only = true;
    c.device = {true, 0, 1};  // the receiver's copy engine reads the sender's GPU memory
  } else if (name == "shm") {
    c.same_host_only = true;
    c.host = {true, 1, 2};    // into a shared slot, out of it
    c.device = {true, 1, 2};  // the same, by copy engines
  } else if (name == "tcp") {
    c.host = {true, 2, 2};    // the user's buffer to the socket buffer and back out at the peer
    c.device = {true, 4, 4};  // plus a pinned staging slot each side
  } else if (name == "devmem") {
    c.nic = true;
    c.needs = "a NIC with devmem TCP";
    c.device = {true, 0, 0};  // the NIC reads and writes GPU memory; the kernel's TCP runs per packet
  } else if (name == "rdma") {
    c.nic = true;
    c.stages = true;
    c.offloaded = true;
    c.needs = "an RDMA device on a PCI function";
    c.host = {true, 0, 0};           // the NIC reads and writes registered memory
    c.device = {true, 0, 0};         // GPUDirect
    c.device_staged = {true, 2, 2};  // a pinned bounce buffer each side, by copy engines
  } else {
    c.known = false;
  }
  return c;
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
