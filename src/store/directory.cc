#include "store/directory.h"

#include <fmt/format.h>

#include <set>

#include "core/log.h"

namespace dmx::store {

Result<std::shared_ptr<Directory>> Directory::open(DirectoryOptions options) {
  DMX_RETURN_IF_ERROR(check_name("store_job", options.job));
  if (options.lease_ttl.count() < 2)
    return Status(Code::kInvalidArgument, "store_lease_ttl must be at least 2s (renewed every third of it)");
  DMX_ASSIGN_OR_RETURN(auto store, open_store(options.url, options.call_timeout));
  return over(std::move(store), std::move(options));
}

std::shared_ptr<Directory> Directory::over(std::unique_ptr<Store> store, DirectoryOptions options) {
  return std::shared_ptr<Directory>(new Directory(std::move(store), std::move(options)));
}

Directory::Directory(std::unique_ptr<Store> store, DirectoryOptions options)
    : opt_(std::move(options)), store_(std::move(store)) {
  thread_ = std::thread([this] { run(); });
}

Directory::~Directory() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  // Our entries go with the lease when it is not renewed; removing them now tells partners at once.
  // Only what is still ours: a newer process of our name may have replaced it.
  if (announced_) {
    auto mine = [&](const std::string& key, const std::string& value) {
      auto kv = store_->get(key);
      return kv.ok() && kv->has_value() && (*kv)->value == value;
    };
    for (const auto& [name, r] : regions_) {
      std::string key = region_key(opt_.job, name);
      if (mine(key, encode(r, opt_.secret))) (void)store_->remove(key);
    }
    std::string key = peer_key(opt_.job, self_.name);
    if (mine(key, encode(self_, opt_.secret))) (void)store_->remove(key);
  }
}

uint64_t Directory::epoch() const {
  std::lock_guard lock(mu_);
  return self_.epoch;
}

std::string Directory::name() const {
  std::lock_guard lock(mu_);
  return self_.name;
}

Result<uint64_t> Directory::announce(PeerEntry self) {
  DMX_RETURN_IF_ERROR(check_name("store_name", self.name));
  std::lock_guard lock(mu_);
  if (announced_)
    return Status(Code::kInvalidArgument,
                  fmt::format("this context is already registered as {}/{}", opt_.job, self_.name));
  self.job = opt_.job;
  DMX_ASSIGN_OR_RETURN(self.epoch, store_->next_epoch(epoch_key(opt_.job, self.name)));
  self_ = std::move(self);
  DMX_ASSIGN_OR_RETURN(lease_, store_->grant(opt_.lease_ttl));
  DMX_RETURN_IF_ERROR(store_->put(peer_key(opt_.job, self_.name), encode(self_, opt_.secret), lease_));
  announced_ = true;
  DMX_LOG_INFO("registered as dmx://{}/{} epoch {} in {} (lease {:x}, ttl {} s)", opt_.job, self_.name, self_.epoch,
               store_->describe(), lease_, opt_.lease_ttl.count());
  return self_.epoch;
}

Status Directory::register_all_locked() {
  DMX_ASSIGN_OR_RETURN(lease_, store_->grant(opt_.lease_ttl));
  DMX_RETURN_IF_ERROR(store_->put(peer_key(opt_.job, self_.name), encode(self_, opt_.secret), lease_));
  for (const auto& [name, r] : regions_)
    DMX_RETURN_IF_ERROR(store_->put(region_key(opt_.job, name), encode(r, opt_.secret), lease_));
  for (const auto& [k, p] : pools_)
    DMX_RETURN_IF_ERROR(store_->put(pool_key(opt_.job, p.host, p.name), encode(p, opt_.secret), lease_));
  return {};
}

Status Directory::publish(RegionEntry region) {
  DMX_RETURN_IF_ERROR(check_name("region name", region.name));
  std::lock_guard lock(mu_);
  if (!announced_)
    return Status(Code::kInvalidArgument,
                  "publish: this context has no name in the store yet (set store_name and listen first)");
  region.job = opt_.job;
  region.owner = self_.name;
  region.owner_epoch = self_.epoch;
  if (region.host.empty()) region.host = self_.host;
  DMX_RETURN_IF_ERROR(store_->put(region_key(opt_.job, region.name), encode(region, opt_.secret), lease_));
  regions_[region.name] = std::move(region);
  return {};
}

Status Directory::unpublish(const std::string& name) {
  std::lock_guard lock(mu_);
  if (regions_.erase(name) == 0) return {};
  return store_->remove(region_key(opt_.job, name));
}

Status Directory::publish_pool(PoolEntry pool) {
  std::lock_guard lock(mu_);
  if (!announced_) return Status(Code::kInvalidArgument, "publish_pool: this context has no name in the store yet");
  pool.job = opt_.job;
  DMX_RETURN_IF_ERROR(store_->put(pool_key(opt_.job, pool.host, pool.name), encode(pool, opt_.secret), lease_));
  pools_[pool.host + "/" + pool.name] = std::move(pool);
  return {};
}

Result<PeerEntry> Directory::lookup_peer(const std::string& name) {
  DMX_RETURN_IF_ERROR(check_name("peer name", name));
  std::string key = peer_key(opt_.job, name);
  DMX_ASSIGN_OR_RETURN(auto kv, store_->get(key));
  if (!kv)
    return Status(Code::kNotFound, fmt::format("dmx://{}/{}: no such peer in {} (never registered, or its lease ended)",
                                               opt_.job, name, store_->describe()));
  DMX_ASSIGN_OR_RETURN(PeerEntry e, decode_peer(key, kv->value, opt_.secret));
  e.lease = kv->lease;
  return e;
}

Result<RegionEntry> Directory::lookup_region(const std::string& name) {
  DMX_RETURN_IF_ERROR(check_name("region name", name));
  std::string key = region_key(opt_.job, name);
  DMX_ASSIGN_OR_RETURN(auto kv, store_->get(key));
  if (!kv)
    return Status(Code::kNotFound,
                  fmt::format("region {} of job {}: not published in {}", name, opt_.job, store_->describe()));
  DMX_ASSIGN_OR_RETURN(RegionEntry r, decode_region(key, kv->value, opt_.secret));
  r.lease = kv->lease;
  auto owner = lookup_peer(r.owner);
  if (!owner.ok() && owner.status().code() != Code::kNotFound) return owner.status();
  if (!owner.ok() || owner->epoch != r.owner_epoch)
    return Status(Code::kPeerFailed,
                  fmt::format("region {}: refused: stale: published by dmx://{}/{} epoch {}, which {}", name, opt_.job,
                              r.owner, r.owner_epoch,
                              owner.ok() ? fmt::format("is now epoch {} (restarted)", owner->epoch)
                                         : std::string("has no live entry (its lease ended)")))
        .with_peer(fmt::format("dmx://{}/{}", opt_.job, r.owner));
  return r;
}

Result<Listing> Directory::list(size_t limit) {
  Listing out;
  DMX_ASSIGN_OR_RETURN(auto peers, store_->list(peers_prefix(opt_.job), limit));
  for (const auto& kv : peers) {
    auto e = decode_peer(kv.key, kv.value, opt_.secret);
    if (!e.ok()) {
      out.refused.push_back(e.status().message());
      continue;
    }
    e->lease = kv.lease;
    out.peers.push_back(std::move(*e));
  }
  DMX_ASSIGN_OR_RETURN(auto regions, store_->list(regions_prefix(opt_.job), limit));
  for (const auto& kv : regions) {
    auto r = decode_region(kv.key, kv.value, opt_.secret);
    if (!r.ok()) {
      out.refused.push_back(r.status().message());
      continue;
    }
    r->lease = kv.lease;
    out.regions.push_back(std::move(*r));
  }
  DMX_ASSIGN_OR_RETURN(auto pools, store_->list(pools_prefix(opt_.job), limit));
  for (const auto& kv : pools) {
    auto p = decode_pool(kv.key, kv.value, opt_.secret);
    if (!p.ok()) {
      out.refused.push_back(p.status().message());
      continue;
    }
    p->lease = kv.lease;
    out.pools.push_back(std::move(*p));
  }
  return out;
}

void Directory::watch(const std::string& name, uint64_t epoch, std::weak_ptr<void> owner,
                      std::function<void(const Status&)> gone) {
  std::lock_guard lock(mu_);
  watches_.push_back(Watch{name, epoch, std::move(owner), std::move(gone)});
}

void Directory::check_watches() {
  std::vector<Watch> ws;
  {
    std::lock_guard lock(mu_);
    std::erase_if(watches_, [](const Watch& w) { return w.owner.expired(); });
    ws = watches_;
  }
  if (ws.empty()) return;
  std::map<std::string, Result<PeerEntry>> seen;
  std::set<size_t> fired;
  for (size_t i = 0; i < ws.size(); ++i) {
    auto it = seen.find(ws[i].name);
    if (it == seen.end()) it = seen.emplace(ws[i].name, lookup_peer(ws[i].name)).first;
    const auto& e = it->second;
    std::string who = fmt::format("dmx://{}/{}", opt_.job, ws[i].name);
    Status why;
    if (e.ok() && e->epoch != ws[i].epoch) {
      why = Status(Code::kPeerFailed, fmt::format("peer {} epoch {} is gone: it restarted (the store has epoch {})", who,
                                                  ws[i].epoch, e->epoch));
    } else if (!e.ok() && e.status().code() == Code::kNotFound) {
      why = Status(Code::kPeerFailed,
                   fmt::format("peer {} epoch {} is gone: its store entry ended with its lease", who, ws[i].epoch));
    } else {
      continue;  // alive, or the store is away (established endpoints go on), or a bad entry
    }
    ws[i].gone(why.with_peer(who).with_origin("store"));
    fired.insert(i);
  }
  if (fired.empty()) return;
  std::lock_guard lock(mu_);
  std::erase_if(watches_, [&](const Watch& w) {
    for (size_t i : fired)
      if (ws[i].name == w.name && ws[i].epoch == w.epoch && !w.owner.owner_before(ws[i].owner) &&
          !ws[i].owner.owner_before(w.owner))
        return true;
    return false;
  });
}

void Directory::run() {
  auto renew_every = std::chrono::duration_cast<std::chrono::milliseconds>(opt_.lease_ttl) / 3;
  auto next_renew = std::chrono::steady_clock::now() + renew_every;
  std::unique_lock lock(mu_);
  while (!stop_) {
    auto next = std::min(next_renew, std::chrono::steady_clock::now() + opt_.watch_interval);
    cv_.wait_until(lock, next, [&] { return stop_; });
    if (stop_) break;
    if (announced_ && std::chrono::steady_clock::now() >= next_renew) {
      next_renew = std::chrono::steady_clock::now() + renew_every;
      Status s = store_->keepalive(lease_);
      if (s.code() == Code::kNotFound) {
        // The lease ended (the store was away longer than its TTL, or lost its data): again, same epoch.
        s = register_all_locked();
        if (s.ok())
          DMX_LOG_WARN("dmx://{}/{}: the store's lease had ended; registered again (epoch {}) in {}", opt_.job,
                       self_.name, self_.epoch, store_->describe());
      }
      if (s.ok() && store_down_) s = register_all_locked();  // back after an outage: make sure all is there
      if (!s.ok() && !store_down_) {
        DMX_LOG_WARN("dmx://{}/{}: cannot renew the store lease: {}; established endpoints go on, retrying every {} ms",
                     opt_.job, self_.name, s.to_string(), renew_every.count());
        store_down_ = true;
      } else if (s.ok() && store_down_) {
        DMX_LOG_WARN("dmx://{}/{}: the store is back: {}", opt_.job, self_.name, store_->describe());
        store_down_ = false;
      }
      if (!s.ok()) next_renew = std::chrono::steady_clock::now() + std::min(renew_every, opt_.watch_interval);
    }
    lock.unlock();
    check_watches();
    lock.lock();
  }
}

}  // namespace dmx::store
