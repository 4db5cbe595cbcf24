// A key-value store that peers of one job share (etcd, PyTorch's TCPStore): the backend under
// store/directory.h. Names, regions and epochs live in it; address-only connection needs none.
//
// Thread-safety: every call may come from any thread (a backend serialises its own connection).
// Every call has a deadline (the call_timeout it was opened with) and fails with kUnavailable
// naming the store when the store cannot be reached; nothing blocks longer.
// Leases: a key put under a lease goes when the lease is not kept alive for its TTL (etcd does this
// itself; TCPStore has no leases, so that backend keeps a heartbeat key per lease and treats a
// key whose lease's heartbeat is older than its TTL as absent: docs/cluster.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dmx/status.h"

namespace dmx::store {

struct KeyValue {
  std::string key;
  std::string value;
  int64_t lease = 0;  // 0: none
};

class Store {
 public:
  virtual ~Store() = default;
  // "etcd http://127.0.0.1:2379" or "tcpstore 10.0.0.1:29500": what errors name.
  virtual std::string describe() const = 0;
  // A new lease of `ttl`; its id.
  virtual Result<int64_t> grant(std::chrono::seconds ttl) = 0;
  // Renews `lease`; kNotFound when it has ended (its keys are gone).
  virtual Status keepalive(int64_t lease) = 0;
  // Puts `key` = `value` (under `lease` when not 0).
  virtual Status put(const std::string& key, const std::string& value, int64_t lease) = 0;
  // The value, or nullopt when the key is absent (or its lease ended).
  virtual Result<std::optional<KeyValue>> get(const std::string& key) = 0;
  // Every live key under `prefix`, at most `limit` of them.
  virtual Result<std::vector<KeyValue>> list(const std::string& prefix, size_t limit) = 0;
  // A number larger than any this call returned for `key` before, on any host (the epoch of a
  // process registering under that name).
  virtual Result<uint64_t> next_epoch(const std::string& key) = 0;
  virtual Status remove(const std::string& key) = 0;
};

// "etcd://host:port" (also "http://host:port": etcd's JSON gateway) or "tcpstore://host:port".
Result<std::unique_ptr<Store>> open_store(const std::string& url, std::chrono::milliseconds call_timeout);

// The backends (store/etcd_store.cc, store/tcp_store.cc).
std::unique_ptr<Store> make_etcd_store(const std::string& host, int port, std::chrono::milliseconds call_timeout);
std::unique_ptr<Store> make_tcp_store(const std::string& host, int port, std::chrono::milliseconds call_timeout);

}  // namespace dmx::store
