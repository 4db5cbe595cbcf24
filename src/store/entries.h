// What dmx puts in a store, and its signature.
//
// Keys: dmx/<job>/peers/<name>, dmx/<job>/regions/<name>, dmx/<job>/pools/<host>/<pool>,
// dmx/<job>/epoch/<name> (the epoch counter). Values: a JSON object with "sig", the hex
// HMAC-SHA256, with the job's auth key, of the object's compact JSON without "sig" (nlohmann's
// dump: keys sorted, so both sides compute the same bytes). The signature covers every field a peer
// acts on (name, job, epoch, addresses, region key and size); an entry whose signature does not
// match, or that names another job or name than the key it was found under, is refused with the
// reason. With insecure=true (no key) entries are unsigned and nothing is checked.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dmx/status.h"

namespace dmx::store {

struct Secret {
  bool insecure = false;
  std::vector<unsigned char> key;
};

struct PeerEntry {
  std::string job, name;
  uint64_t epoch = 0;
  std::vector<std::string> addresses;   // "tcp://10.0.0.2:7000"
  std::vector<std::string> transports;  // what it offers: "tcp", "shm", ...
  std::string host;
  uint32_t pid = 0;
  int64_t lease = 0;  // filled from the store on reading (not signed: the store's own)
};

struct RegionEntry {
  std::string job, name;
  std::string owner;  // the peer that registered it
  uint64_t owner_epoch = 0;
  uint64_t key = 0, size = 0;
  std::string memory;  // "host", "cuda", "sim", ...
  int device = -1;     // the GPU index for device memory
  std::string host;
  int64_t lease = 0;
};

struct PoolEntry {
  std::string job, host, name;  // the orchestrator's pool: "gpu0", "numa0", "p2pmem:0000:3b:00.0"
  std::string kind;
  int device = -1, numa = -1;
  uint64_t bytes = 0;
  int64_t lease = 0;
};

// Names are 1-128 of [A-Za-z0-9._-] ("worker-3"); a job the same.
Status check_name(std::string_view what, std::string_view name);

std::string peer_key(std::string_view job, std::string_view name);
std::string region_key(std::string_view job, std::string_view name);
std::string pool_key(std::string_view job, std::string_view host, std::string_view name);
std::string epoch_key(std::string_view job, std::string_view name);
std::string peers_prefix(std::string_view job);
std::string regions_prefix(std::string_view job);
std::string pools_prefix(std::string_view job);

std::string encode(const PeerEntry& e, const Secret& s);
std::string encode(const RegionEntry& e, const Secret& s);
std::string encode(const PoolEntry& e, const Secret& s);
// Each checks the signature, then that the entry belongs under `key` (job and name); kAuth when
// forged or altered, kProtocol when malformed. The message names the key.
Result<PeerEntry> decode_peer(const std::string& key, std::string_view value, const Secret& s);
Result<RegionEntry> decode_region(const std::string& key, std::string_view value, const Secret& s);
Result<PoolEntry> decode_pool(const std::string& key, std::string_view value, const Secret& s);

}  // namespace dmx::store
