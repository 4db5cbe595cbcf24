#include "engine/cluster.h"

#include <fmt/format.h>
#include <unistd.h>

#include "core/log.h"
#include "engine/context_impl.h"
#include "engine/endpoint/endpoint_impl.h"
#include "engine/handshake.h"
#include "engine/links.h"

namespace dmx {

Result<std::shared_ptr<store::Directory>> open_directory(const Config& config, const AuthKey& auth) {
  std::string url = config.get_string("store");
  if (url.empty()) return std::shared_ptr<store::Directory>();
  store::DirectoryOptions o;
  o.url = url;
  o.job = config.get_string("store_job");
  o.lease_ttl = std::chrono::duration_cast<std::chrono::seconds>(config.get_duration("store_lease_ttl"));
  o.call_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(config.get_duration("store_timeout"));
  o.watch_interval = std::chrono::duration_cast<std::chrono::milliseconds>(config.get_duration("store_watch_interval"));
  if (o.call_timeout.count() <= 0 || o.watch_interval.count() <= 0)
    return Status(Code::kInvalidArgument, "store_timeout and store_watch_interval must be positive");
  o.secret.insecure = auth.insecure;
  o.secret.key = auth.secret;
  if (std::string name = config.get_string("store_name"); !name.empty())
    DMX_RETURN_IF_ERROR(store::check_name(fmt::format("setting store_name ({})", config.source("store_name")), name));
  auto d = store::Directory::open(std::move(o));
  if (!d.ok())
    return Status(d.status().code(), fmt::format("setting store ({}): {}", config.source("store"), d.status().message()));
  return d;
}

namespace {

// The orchestrator's pools as the store lists them: named by the process that keeps their books
// (`owner`, its name in the store: processes of one host each publish theirs, and one's lease
// ending must not take another's entries) and by where they are (a NUMA node, a PCI address), so
// `dmx ls` shows the placement; a GPU's entry carries its CUDA ordinal (-1 unknown).
std::vector<store::PoolEntry> pool_entries(const topo::Placement& placement, const std::string& owner,
                                           const std::string& host) {
  const topo::Topology& t = placement.topology();
  std::vector<store::PoolEntry> out;
  for (const topo::PoolUsage& u : placement.usage()) {
    if (!u.published) continue;
    store::PoolEntry e;
    e.host = host;
    e.kind = std::string(topo::pool_kind_name(u.desc.kind));
    e.numa = u.desc.numa_node;
    e.bytes = u.desc.capacity;
    bool on_device = u.desc.pci >= 0 && u.desc.pci < static_cast<int>(t.devices.size());
    std::string bdf = on_device ? t.devices[static_cast<size_t>(u.desc.pci)].addr.to_string() : "";
    switch (u.desc.kind) {
      case topo::PoolKind::kPinnedHost:
        e.name = fmt::format("{}:host-node{}", owner, u.desc.numa_node);
        break;
      case topo::PoolKind::kGpu:
        if (!on_device) continue;
        e.name = fmt::format("{}:gpu-{}", owner, bdf);
        e.device = t.cuda_ordinal(u.desc.pci);
        if (e.device < 0 && t.cuda.devices.empty())  // no CUDA overlay: CUDA's PCI order, as the placement names it
          for (size_t i = 0; i < t.gpus.size(); ++i)
            if (t.gpus[i] == u.desc.pci) e.device = static_cast<int>(i);
        break;
      case topo::PoolKind::kDeviceBar:
        if (!on_device) continue;
        e.name = fmt::format("{}:p2pmem-{}", owner, bdf);
        break;
    }
    out.push_back(std::move(e));
  }
  return out;
}

// Once this process has its name: the machine's pools (topo/placement.h) go into the store under
// its lease. A machine whose topology cannot be read has none to publish (the placement said why);
// a pool the store refuses is logged, and the listener works on without it.
void publish_pools(ContextImpl& ctx, store::Directory& dir) {
  auto placement = ctx.placement().machine();
  if (!placement) return;
  size_t published = 0;
  for (store::PoolEntry& e : pool_entries(*placement, dir.name(), ctx.hostname())) {
    std::string name = e.name;
    if (Status s = dir.publish_pool(std::move(e)); !s.ok()) {
      DMX_LOG_WARN("store {}: pool {} not published: {}", dir.describe(), name, s.to_string());
      continue;
    }
    ++published;
  }
  DMX_LOG_INFO("store {}: published {} memory pool(s) of {}", dir.describe(), published, ctx.hostname());
}

}  // namespace

namespace {

// What the store hands out for a listener at `address` (tcp://host:port): the address itself, or,
// for a wildcard listener (0.0.0.0, ::), this host's addresses in interface order (the `nics`
// setting narrows them): a peer connects to the first that answers, and the HELLO lists the
// others, so its data streams spread over them (several NICs, engine/links.h).
std::vector<std::string> store_addresses(const std::string& address, const std::string& nics) {
  const std::string scheme = "tcp://";
  auto colon = address.rfind(':');
  if (address.rfind(scheme, 0) != 0 || colon == std::string::npos || colon < scheme.size()) return {address};
  std::string host = address.substr(scheme.size(), colon - scheme.size()), port = address.substr(colon + 1);
  std::vector<std::string> out;
  for (const std::string& a : advertised_addresses(host, "", nics))
    out.push_back(a.find(':') == std::string::npos ? fmt::format("tcp://{}:{}", a, port)
                                                   : fmt::format("tcp://[{}]:{}", a, port));
  if (out.empty()) out.push_back(address);  // not a wildcard, or no interface but loopback
  return out;
}

}  // namespace

Status ContextImpl::announce(const std::string& address) {
  std::string name = config_.get_string("store_name");
  if (!directory_ || name.empty()) return {};
  std::lock_guard lock(announce_mu_);
  if (directory_->epoch() != 0) return {};  // the first listener registered it
  store::PeerEntry self;
  self.name = name;
  self.addresses = store_addresses(address, params_.nics);
  for (const auto& t : transports()) self.transports.emplace_back(t->name());
  self.host = hostname_;
  self.pid = static_cast<uint32_t>(::getpid());
  auto epoch = directory_->announce(std::move(self));
  if (!epoch.ok()) return epoch.status();
  publish_pools(*this, *directory_);
  return Status();
}

void ContextImpl::watch_peer(const std::string& name, uint64_t epoch, const std::shared_ptr<RegistrationUser>& ep) {
  if (!directory_ || name.empty() || epoch == 0) return;
  std::weak_ptr<RegistrationUser> w = ep;
  directory_->watch(name, epoch, std::weak_ptr<void>(std::shared_ptr<void>(ep)), [w](const Status& why) {
    if (auto e = w.lock()) e->abandon(why);
  });
}

bool is_name_address(const std::string& address) { return address.rfind("dmx://", 0) == 0; }

Result<std::shared_ptr<EndpointImpl>> connect_by_name(const std::shared_ptr<ContextImpl>& ctx,
                                                      const std::string& address) {
  const auto& dir = ctx->directory();
  if (!dir)
    return Status(Code::kInvalidArgument,
                  fmt::format("connect({}): no store is configured (the store setting: etcd://host:port or "
                              "tcpstore://host:port)", address));
  std::string rest = address.substr(6);
  auto slash = rest.find('/');
  if (slash == std::string::npos)
    return Status(Code::kInvalidArgument, fmt::format("connect({}): want dmx://<job>/<name>", address));
  std::string job = rest.substr(0, slash), name = rest.substr(slash + 1);
  if (job != dir->job())
    return Status(Code::kInvalidArgument, fmt::format("connect({}): this context sees job {} (store_job), not {}",
                                                      address, dir->job(), job));
  DMX_ASSIGN_OR_RETURN(store::PeerEntry peer, dir->lookup_peer(name));
  Status last;
  const std::vector<std::string> addresses = peer.addresses;  // peer may be looked up again below
  for (const auto& a : addresses) {
    auto ep = connect_endpoint(ctx, a);
    if (!ep.ok()) {
      last = ep.status();
      continue;
    }
    const Session& s = (*ep)->session();
    // The name restarted between the lookup and the handshake: a newer epoch of the same name is
    // taken once the store shows it.
    if (s.peer_name == name && s.peer_epoch > peer.epoch) {
      auto again = dir->lookup_peer(name);
      if (again.ok() && again->epoch == s.peer_epoch) peer = std::move(*again);
    }
    if (s.peer_name != name || s.peer_epoch != peer.epoch) {
      Status why(Code::kAuth,
                 fmt::format("connect({}): the process at {} is {} epoch {}, the store has {} epoch {}: a stale entry "
                             "or an impostor; not used",
                             address, a, s.peer_name.empty() ? "unnamed" : s.peer_name, s.peer_epoch, name, peer.epoch));
      (void)(*ep)->close();
      last = why.with_peer(address);
      continue;
    }
    return ep;
  }
  return last.ok() ? Status(Code::kNotFound, fmt::format("connect({}): its entry has no address", address)) : last;
}

// --- Context ---

namespace {
Result<store::Directory*> need_directory(const std::shared_ptr<ContextImpl>& ctx, const char* call) {
  if (!ctx->directory())
    return Status(Code::kInvalidArgument,
                  fmt::format("{}: no store is configured (the store setting: etcd://host:port or tcpstore://host:port)",
                              call));
  return ctx->directory().get();
}

PublishedRegion to_public(const store::RegionEntry& r) {
  PublishedRegion p;
  p.name = r.name;
  p.owner = r.owner;
  p.owner_epoch = r.owner_epoch;
  p.region = RemoteRegion{r.key, r.size, r.owner_epoch};
  p.memory = r.memory;
  p.device = r.device;
  p.host = r.host;
  p.lease = r.lease;
  return p;
}

PeerInfo to_public(const store::PeerEntry& e) {
  return PeerInfo{e.name, e.epoch, e.addresses, e.transports, e.host, e.pid, e.lease};
}

}  // namespace

Status Context::publish(const std::string& name, const Registration& registration) {
  DMX_ASSIGN_OR_RETURN(store::Directory * dir, need_directory(impl_, "publish"));
  RemoteRegion rr = registration.remote();
  if (rr.key == 0) return Status(Code::kInvalidArgument, fmt::format("publish({}): an empty registration", name));
  store::RegionEntry r;
  r.name = name;
  r.key = rr.key;
  r.size = rr.size;
  const MemSpec where = registration.where();
  r.memory = std::string(mem_kind_name(where.kind));
  r.device = where.kind == MemKind::kCuda ? where.device : -1;
  r.host = impl_->hostname();
  return dir->publish(std::move(r));
}

Status Context::unpublish(const std::string& name) {
  DMX_ASSIGN_OR_RETURN(store::Directory * dir, need_directory(impl_, "unpublish"));
  return dir->unpublish(name);
}

Result<PublishedRegion> Context::lookup(const std::string& name) {
  DMX_ASSIGN_OR_RETURN(store::Directory * dir, need_directory(impl_, "lookup"));
  DMX_ASSIGN_OR_RETURN(store::RegionEntry r, dir->lookup_region(name));
  return to_public(r);
}

Result<PeerInfo> Context::lookup_peer(const std::string& name) {
  DMX_ASSIGN_OR_RETURN(store::Directory * dir, need_directory(impl_, "lookup_peer"));
  DMX_ASSIGN_OR_RETURN(store::PeerEntry e, dir->lookup_peer(name));
  return to_public(e);
}

Result<ClusterListing> Context::cluster() {
  DMX_ASSIGN_OR_RETURN(store::Directory * dir, need_directory(impl_, "cluster"));
  DMX_ASSIGN_OR_RETURN(store::Listing l, dir->list());
  ClusterListing out;
  out.store = dir->describe();
  out.job = dir->job();
  for (const auto& e : l.peers) out.peers.push_back(to_public(e));
  for (const auto& r : l.regions) out.regions.push_back(to_public(r));
  for (const auto& p : l.pools) out.pools.push_back(PublishedPool{p.host, p.name, p.kind, p.device, p.numa, p.bytes});
  out.refused = std::move(l.refused);
  return out;
}

uint64_t Context::epoch() const { return impl_->epoch(); }

}  // namespace dmx
