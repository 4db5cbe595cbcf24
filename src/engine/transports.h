// The transports this engine can use, and what each costs per byte: the only engine file that
// names one. The list's order is the order of offers, so of path ids; the order a chunk tries them
// in is the ranking's (engine/ranking.h), per memory kind, from transport_costs() and the topology.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "transport/transport.h"

namespace dmx {

using TransportList = std::vector<std::shared_ptr<Transport>>;

// A fresh registry for a new context: cuda_ipc, devmem, shm, shm_pipe, tcp, then those added
// with add_transport.
TransportList default_transports();

// Process-wide: every context created afterwards also has the transport `make` returns (tests:
// transports that live in the tests). Any thread.
void add_transport(std::function<std::shared_ptr<Transport>()> make);

// Whether `name` may be the transport setting: auto, or a transport of `list` that carries
// payload (a path, or the streams); kInvalidArgument naming `source` (where the value came from),
// the value, the choices and the nearest one when not.
Status check_transport_setting(const TransportList& list, const std::string& name, const std::string& source);

// The metrics rows: the streams' transport first (row 0: stream bytes and inline operations),
// then each transport's metric_name() once.
std::vector<std::string> metric_names(const TransportList& list);

// What moving a byte by a transport costs, for the ranking (engine/ranking.h). Known by name, so
// that a transport ranks rightly from its first registry line (rdma included); `known` is false
// for names not in the table (test transports), which rank after the known paths.
struct TransportCosts {
  struct Cost {
    bool carries = false;  // moves this kind of memory at all
    int host_passes = 0;   // host-memory buffers each byte passes through, both sides together
    int copies = 0;        // copies per byte by a CPU or a copy engine, both sides together
  };
  bool known = false;
  bool same_host_only = false;  // works within one host (shared memory, CUDA IPC)
  bool nic = false;             // the NIC touches device memory: the topology advisor decides per GPU
  bool stages = false;          // nic: stages device memory through host memory when the advisor says so
  bool offloaded = false;       // nic: the NIC runs the protocol (no per-packet CPU work)
  std::string_view needs;       // nic: what the NIC must be ("an RDMA device on a PCI function")
  Cost host;                    // host or pinned memory
  Cost device;                  // device memory (for nic: when the NIC reaches it directly)
  Cost device_staged;           // nic + stages: device memory staged through host memory
};
TransportCosts transport_costs(std::string_view name);

// Puts `t` in place of the transport of its name, or last (tests: doubles and extra transports).
void register_transport(TransportList& list, std::shared_ptr<Transport> t);

}  // namespace dmx
