// dmx/cluster.h — names, published regions and epochs in a store (etcd, PyTorch's TCPStore).
//
// Optional: with the `store` setting empty (the default) nothing here is used and peers meet by
// address. With it set (etcd://host:port or tcpstore://host:port), a context that listens with
// `store_name` set registers that name (dmx://<store_job>/<store_name>) with its listen address
// and a new epoch, under a lease it keeps alive; Context::connect("dmx://job/name") looks the
// name up and connects; Context::publish/lookup share registered regions by name. Every entry is
// signed with the job's auth key and checked when read (docs/cluster.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dmx/endpoint.h"

namespace dmx {

// A peer as the store lists it.
struct PeerInfo {
  std::string name;  // "worker-3"
  uint64_t epoch = 0;
  std::vector<std::string> addresses;
  std::vector<std::string> transports;
  std::string host;
  uint32_t pid = 0;
  int64_t lease = 0;  // the store's lease id
};

// A region another process published under a name (Context::publish).
struct PublishedRegion {
  std::string name;
  std::string owner;         // the peer's name: connect to "dmx://<job>/<owner>"
  uint64_t owner_epoch = 0;  // the owner's epoch that published it
  RemoteRegion region;       // region.epoch = owner_epoch: refused on an endpoint to another epoch
  std::string memory;        // "host", "cuda", "sim"
  int device = -1;           // the GPU index of device memory
  std::string host;
  int64_t lease = 0;
};

// The orchestrator's pools (topo/placement.h) one host published.
struct PublishedPool {
  std::string host, name, kind;
  int device = -1, numa = -1;
  uint64_t bytes = 0;
};

struct ClusterListing {
  std::string store;  // "etcd http://10.0.0.1:2379"
  std::string job;
  std::vector<PeerInfo> peers;
  std::vector<PublishedRegion> regions;
  std::vector<PublishedPool> pools;
  std::vector<std::string> refused;  // entries that failed their check, each with why
};

}  // namespace dmx
