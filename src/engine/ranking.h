// The order in which an endpoint's sender tries its agreed transports, per memory kind of the
// source: the topology advisor's PCIe arithmetic (topo/advisor.h) for transports whose NIC touches
// device memory, and each transport's costs per byte (host-memory passes, copies; TransportCosts
// in engine/transports.h) for the rest. Inline on the streams (the tcp transport) is ranked with
// the paths, so a path can rank below it (devmem where the GPU and the NIC meet only at the root
// complex). The `transport` setting forces its transport first.
//
// Only the sender uses the order (endpoint/paths.cc, path_for): path ids stay positions in the
// server's HELLO list, and the receiver takes a chunk by whatever agreed path its header names, so
// the two sides need not rank alike (docs/wire.md).
//
// Thread-safety: TransportRanking is immutable after construction except for its cache, which
// its own mutex guards; rank() may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dmx/memory.h"
#include "engine/transports.h"
#include "topo/topology.h"

namespace dmx {

struct RankedPath {
  uint8_t id = 0;    // the path id (position in the agreed list + 1); 0: inline on the streams
  std::string name;  // the transport's name
  std::string how;   // its costs for this kind, in words
};

struct KindRanking {
  std::vector<RankedPath> order;  // best first; only transports that carry this kind
  std::string text;               // "rdma (...) > tcp (...): rdma won: ..."
};

// What the ranking is computed from: the same facts negotiate() has.
struct RankingInputs {
  TransportList agreed;                          // path id k is agreed[k - 1]
  PeerPair pair;
  std::string forced = "auto";                   // the transport setting
  std::shared_ptr<const topo::Topology> topo;    // null: unknown (topo_why says why)
  std::string topo_why;
  std::string devmem_ifname;                     // the NIC devmem uses
};

// Whether the ranking needs the topology: an agreed transport whose NIC touches device memory.
bool ranking_needs_topology(const TransportList& agreed);

// The ranking for sources of kind `src` (host and pinned rank alike; device memory per device:
// CUDA ordinal, or a sim id read as one).
KindRanking rank_transports(const RankingInputs& in, const MemSpec& src);

class TransportRanking {
 public:
  explicit TransportRanking(RankingInputs in);
  // Cached per kind and device (at most kMaxCached; past that computed each time).
  std::shared_ptr<const KindRanking> rank(const MemSpec& src) const;
  // For the session's reason: host memory, then device memory (per GPU of the topology when a
  // NIC transport is agreed, else once for every device).
  std::string summary() const;

 private:
  static constexpr size_t kMaxCached = 64;
  const RankingInputs in_;
  const std::shared_ptr<const KindRanking> host_;  // host and pinned memory: no lock per chunk
  mutable std::mutex mu_;  // guards cache_
  mutable std::map<std::pair<int, int>, std::shared_ptr<const KindRanking>> cache_;
};

}  // namespace dmx
