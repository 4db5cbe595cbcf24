// A process's view of its job in a store (store/store.h): it registers itself (name → addresses,
// epoch) under a lease it keeps alive, publishes regions and pools, looks others up with every
// entry's signature checked (store/entries.h), and watches the peers its endpoints talk to.
//
// Epochs: a process that registers a name takes a new epoch from the store (etcd: the cluster
// revision of a put to dmx/<job>/epoch/<name>; TCPStore: ADD on that key), larger than any
// earlier one of that name. Leases: every entry of this process is put under one lease of
// store_lease_ttl, renewed every third of it by this directory's thread; when the lease is lost
// (the store was away longer than the TTL) the thread registers everything again, same epoch.
// While the store is unreachable, lookups fail with kUnavailable naming it; watches wait.
//
// Thread-safety: all calls from any thread. One thread of its own (keep-alive and watches), joined
// by the destructor; every store call has the store's deadline.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "store/entries.h"
#include "store/store.h"

namespace dmx::store {

struct DirectoryOptions {
  std::string url;  // store_url
  std::string job = "dmx";
  std::chrono::seconds lease_ttl{10};
  std::chrono::milliseconds call_timeout{2000};
  std::chrono::milliseconds watch_interval{1000};
  Secret secret;
};

struct Listing {
  std::vector<PeerEntry> peers;
  std::vector<RegionEntry> regions;
  std::vector<PoolEntry> pools;
  std::vector<std::string> refused;  // entries refused, each with why
};

class Directory {
 public:
  static Result<std::shared_ptr<Directory>> open(DirectoryOptions options);
  // For tests: a directory over a store already made.
  static std::shared_ptr<Directory> over(std::unique_ptr<Store> store, DirectoryOptions options);
  ~Directory();

  const std::string& job() const { return opt_.job; }
  std::string describe() const { return store_->describe(); }

  // Registers this process as `self.name` (job filled in) with a new epoch; returns the epoch.
  // Once per directory.
  Result<uint64_t> announce(PeerEntry self);
  uint64_t epoch() const;
  std::string name() const;

  // Publishes a region of this process (owner and epoch filled in; needs announce()).
  Status publish(RegionEntry region);
  Status unpublish(const std::string& name);
  Status publish_pool(PoolEntry pool);

  // Looks a peer up: kNotFound when no live entry, kAuth when forged, kUnavailable when the store
  // is unreachable.
  Result<PeerEntry> lookup_peer(const std::string& name);
  // Looks a region up and checks that its owner is alive at the epoch that published it:
  // kNotFound, kAuth (forged), kPeerFailed when stale (the owner restarted or is gone).
  Result<RegionEntry> lookup_region(const std::string& name);
  Result<Listing> list(size_t limit = 4096);

  // Calls `gone` once (on this directory's thread) when peer `name` is no longer at `epoch` in the
  // store: a new epoch (it restarted) or no entry (its lease ended). Dropped once `owner` expires.
  void watch(const std::string& name, uint64_t epoch, std::weak_ptr<void> owner,
             std::function<void(const Status&)> gone);

  Store& store() { return *store_; }

 private:
  Directory(std::unique_ptr<Store> store, DirectoryOptions options);
  void run();
  Status register_all_locked();
  void check_watches();

  struct Watch {
    std::string name;
    uint64_t epoch;
    std::weak_ptr<void> owner;
    std::function<void(const Status&)> gone;
  };

  const DirectoryOptions opt_;
  std::unique_ptr<Store> store_;
  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  bool stop_ = false;
  bool announced_ = false;
  PeerEntry self_;
  int64_t lease_ = 0;
  std::map<std::string, RegionEntry> regions_;  // published, by name
  std::map<std::string, PoolEntry> pools_;
  std::vector<Watch> watches_;
  bool store_down_ = false;  // said once per outage
  std::thread thread_;
};

}  // namespace dmx::store
