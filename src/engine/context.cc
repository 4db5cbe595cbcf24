#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "core/log.h"
#include "core/sys.h"
#include "core/units.h"
#include "engine/cluster.h"
#include "engine/context_impl.h"
#include "engine/endpoint/endpoint_impl.h"
#include "engine/handshake.h"
#include "wire/handshake.h"

namespace dmx {
namespace {

std::string read_boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id.size() <= 64 ? id : id.substr(0, 64);
}

Result<EngineParams> params_from(const Config& c) {
  EngineParams p;
  int64_t streams = c.get_int("streams");
  if (streams < 1 || streams > wire::kMaxStreams)
    return Status(Code::kInvalidArgument, fmt::format("setting streams ({}): {} is not in 1-{}", c.source("streams"),
                                                      streams, wire::kMaxStreams));
  p.streams = static_cast<uint16_t>(streams);
  int64_t max_streams = c.get_int("max_streams");
  if (max_streams < 1 || max_streams > wire::kMaxStreams)
    return Status(Code::kInvalidArgument, fmt::format("max_streams must be 1-{} (got {})", wire::kMaxStreams, max_streams));
  p.max_streams = static_cast<uint16_t>(max_streams);
  int64_t max_endpoints = c.get_int("max_endpoints");
  if (max_endpoints < 1 || max_endpoints > (1 << 20))
    return Status(Code::kInvalidArgument, "max_endpoints must be 1-1048576");
  p.max_endpoints = static_cast<int>(max_endpoints);
  int64_t per_peer = c.get_int("max_endpoints_per_peer");
  if (per_peer < 0 || per_peer > (1 << 20))
    return Status(Code::kInvalidArgument, "max_endpoints_per_peer must be 0-1048576");
  p.max_endpoints_per_peer = per_peer == 0 ? p.max_endpoints : static_cast<int>(per_peer);
  p.peer_memory_budget = c.get_size("peer_memory_budget");
  if (p.peer_memory_budget == 0) {  // half of this host's memory: room for large plans, not for an OOM kill
    long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    uint64_t half = pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) / 2 : 0;
    p.peer_memory_budget = std::max<uint64_t>(half, uint64_t{1} << 30);
  }
  uint64_t chunk = c.get_size("chunk_size");
  if (chunk < wire::kMinChunk || chunk > wire::kMaxChunk)
    return Status(Code::kInvalidArgument,
                  fmt::format("setting chunk_size ({}): {} is not in 64K-64M", c.source("chunk_size"), chunk));
  p.chunk_size = static_cast<uint32_t>(chunk);
  uint64_t host_chunk = c.get_size("host_chunk_size");
  if (host_chunk < wire::kMinChunk || host_chunk > wire::kMaxChunk)
    return Status(Code::kInvalidArgument, fmt::format("host_chunk_size must be 64K-64M (got {})", host_chunk));
  p.host_chunk_size = static_cast<uint32_t>(host_chunk);
  p.nt_receive_min = c.get_size("nt_receive_min");
  if (p.nt_receive_min == 0) p.nt_receive_min = UINT64_MAX;
  uint64_t eager = c.get_size("eager_limit");
  if (eager > chunk) return Status(Code::kInvalidArgument, "eager_limit must not exceed chunk_size");
  p.eager_limit = static_cast<uint32_t>(eager);
  p.unexpected_budget = c.get_size("unexpected_budget");
  if (p.unexpected_budget > wire::kMaxUnexpectedBudget)
    return Status(Code::kInvalidArgument, "unexpected_budget must be at most 1T");
  int64_t slots = c.get_int("staging_slots");
  if (slots < 2 || slots > 64) return Status(Code::kInvalidArgument, "staging_slots must be 2-64");
  p.staging_slots = static_cast<int>(slots);
  int64_t ops = c.get_int("max_inflight_ops");
  if (ops < 16 || ops > (1 << 20)) return Status(Code::kInvalidArgument, "max_inflight_ops must be 16-1048576");
  p.max_inflight_ops = static_cast<int>(ops);
  p.max_reply_backlog = c.get_size("max_reply_backlog");
  if (p.max_reply_backlog < 64 * 1024) return Status(Code::kInvalidArgument, "max_reply_backlog must be at least 64K");
  int64_t budget = c.get_int("peer_error_budget");
  if (budget < 1 || budget > (1 << 30)) return Status(Code::kInvalidArgument, "peer_error_budget must be 1-1073741824");
  p.peer_error_budget = static_cast<int>(budget);
  int64_t notes = c.get_int("max_notifications");
  if (notes < 1 || notes > (1 << 24)) return Status(Code::kInvalidArgument, "max_notifications must be 1-16777216");
  p.max_notifications = static_cast<size_t>(notes);
  p.keepalive = c.get_duration("keepalive_interval");
  p.peer_timeout = c.get_duration("peer_timeout");
  if (p.keepalive.count() <= 0 || p.peer_timeout <= 2 * p.keepalive)
    return Status(Code::kInvalidArgument, "peer_timeout must exceed twice keepalive_interval");
  p.busy_peer_timeout = c.get_duration("busy_peer_timeout");
  if (p.busy_peer_timeout.count() != 0 && p.busy_peer_timeout < std::chrono::milliseconds(100))
    return Status(Code::kInvalidArgument, "busy_peer_timeout must be 0 (off) or at least 100ms");
  p.busy_peer_timeout = std::min(p.busy_peer_timeout, p.peer_timeout);  // a patient peer_timeout is patient here too
  p.connect_timeout = c.get_duration("connect_timeout");
  p.handshake_timeout = c.get_duration("handshake_timeout");
  p.deregister_timeout = c.get_duration("deregister_timeout");
  p.stop_timeout = c.get_duration("stop_timeout");
  if (p.stop_timeout.count() <= 0) return Status(Code::kInvalidArgument, "stop_timeout must be positive");
  uint64_t sb = c.get_size("socket_buffer");
  if (sb > (1u << 30)) return Status(Code::kInvalidArgument, "socket_buffer must be at most 1G");
  p.socket_buffer = static_cast<int>(sb);
  p.transport = c.get_string("transport");
  std::string checksum = c.get_string("checksum");
  if (checksum != "none" && checksum != "crc32c")
    return Status(Code::kInvalidArgument, fmt::format("checksum must be none or crc32c (got '{}')", checksum));
  p.checksum = checksum == "crc32c";
  std::string multilink = c.get_string("multilink");
  if (multilink == "off") p.multilink = static_cast<uint8_t>(wire::Multilink::kOff);
  else if (multilink == "auto") p.multilink = static_cast<uint8_t>(wire::Multilink::kAuto);
  else if (multilink == "on") p.multilink = static_cast<uint8_t>(wire::Multilink::kOn);
  else return Status(Code::kInvalidArgument, fmt::format("multilink must be auto, on or off (got '{}')", multilink));
  p.nics = c.get_string("nics");
  p.reconnect_timeout = c.get_duration("reconnect_timeout");
  if (p.reconnect_timeout.count() < 0) return Status(Code::kInvalidArgument, "reconnect_timeout must not be negative");
  const unsigned cpus = usable_cpus();
  p.busy_poll = c.get_duration("busy_poll");
  for (const auto& item : c.items())  // an explicit value is always honoured; the default adapts
    if (item.entry->name == "busy_poll" && item.source == "default" && cpus < 8)
      p.busy_poll = std::chrono::microseconds(0);
  if (p.busy_poll > std::chrono::milliseconds(100)) return Status(Code::kInvalidArgument, "busy_poll must be at most 100ms");
  int64_t workers = c.get_int("stream_workers");
  if (workers < 0 || workers > 1024) return Status(Code::kInvalidArgument, "stream_workers must be 0-1024");
  p.stream_workers = workers > 0 ? static_cast<int>(workers) : static_cast<int>(std::clamp(cpus, 1u, 16u));
  p.workers_per_endpoint = c.get_string("stream_worker_scope") == "endpoint";
  int64_t list_threads = c.get_int("list_threads");
  if (list_threads < 0 || list_threads > 8)
    return Status(Code::kInvalidArgument, fmt::format("setting list_threads ({}): {} is not 0 (automatic) or 1-8",
                                                      c.source("list_threads"), list_threads));
  p.list_threads = list_threads > 0 ? static_cast<int>(list_threads) : CopyCrew::automatic_threads(cpus);
  DMX_ASSIGN_OR_RETURN(topo::PushMode push, topo::parse_push_mode(c.get_string("gpu_push")));
  uint64_t push_max = c.get_size("gpu_push_max");
  p.push_tx = topo::plan_gpu_push(push, push_max, topo::push_facts(topo::PushLink::kHostWrite));
  p.push_rx = topo::plan_gpu_push(push, push_max, topo::push_facts(topo::PushLink::kHostRead));
  return p;
}

}  // namespace

Result<std::shared_ptr<ContextImpl>> ContextImpl::create(const Options& options) {
  DMX_ASSIGN_OR_RETURN(Config config, Config::resolve(options));
  set_log_level(config.get_string("log_level"));
  DMX_ASSIGN_OR_RETURN(EngineParams params, params_from(config));
  DMX_ASSIGN_OR_RETURN(AuthKey auth, load_auth_key(config));
  auto impl = std::shared_ptr<ContextImpl>(new ContextImpl(std::move(config), std::move(params), std::move(auth)));
  DMX_RETURN_IF_ERROR(check_transport_setting(impl->transports_, impl->params_.transport,
                                              impl->config_.source("transport")));
  DMX_ASSIGN_OR_RETURN(impl->directory_, open_directory(impl->config_, impl->auth_));
  return impl;
}

ContextImpl::ContextImpl(Config config, EngineParams params, AuthKey auth)
    : config_(std::move(config)),
      params_(std::move(params)),
      auth_(std::move(auth)),
      placement_(config_.get_string("sysfs_root")),
      staging_(params_.chunk_size, &placement_),
      transports_(default_transports()),
      metrics_(transports_),
      workers_(params_.stream_workers, "dmx-w"),
      list_crew_(CopyCrew::make(params_.list_threads)),
      budget_(std::make_shared<MemoryBudget>(params_.peer_memory_budget)) {
  boot_id_ = read_boot_id();
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  hostname_ = host;
}

namespace {

// GPU pools get CUDA memory; without CUDA (build or driver) a request for it fails with the reason.
topo::DeviceMemory cuda_pool_memory() {
  return topo::DeviceMemory{
      [](int ordinal, uint64_t bytes) -> Result<void*> {
        DMX_ASSIGN_OR_RETURN(MemoryBackend * b, backend_for(MemSpec{MemKind::kCuda, ordinal}));
        return b->allocate(bytes);
      },
      [](int ordinal, void* p, uint64_t bytes) {
        if (auto b = backend_for(MemSpec{MemKind::kCuda, ordinal}); b.ok()) (*b)->free(p, bytes);
      }};
}

std::atomic<uint64_t> g_placement_users{0};

}  // namespace

void StagingPlacement::ensure_locked() {
  if (tried_) return;
  tried_ = true;
  name_ = fmt::format("staging of context {}/{}", ::getpid(), g_placement_users.fetch_add(1) + 1);
  auto p = topo::Placement::for_root(sysfs_root_, cuda_pool_memory());
  if (!p.ok()) {
    DMX_LOG_INFO("staging placement: {}; staging uses the default NUMA policy", p.status().message());
    return;
  }
  placement_ = *p;
}

std::shared_ptr<topo::Placement> StagingPlacement::machine() {
  std::lock_guard<std::mutex> lock(mu_);
  ensure_locked();
  return placement_;
}

int StagingPlacement::place(MemSpec device, size_t bytes, uint64_t* ticket) {
  *ticket = 0;
  std::lock_guard<std::mutex> lock(mu_);
  ensure_locked();
  if (!placement_) return -1;
  topo::Allocation booked;
  int node = placement_->stage(device.device, bytes, fmt::format("{} for {}", name_, to_string(device)), &booked);
  if (booked.size != 0) {
    *ticket = next_ticket_++;
    tickets_[*ticket] = booked;
  }
  return node;
}

void StagingPlacement::unplace(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tickets_.find(ticket);
  if (it == tickets_.end() || !placement_) return;
  placement_->unstage(it->second);
  tickets_.erase(it);
}

std::vector<topo::PoolUsage> StagingPlacement::usage() const {
  std::lock_guard<std::mutex> lock(mu_);
  return placement_ ? placement_->usage() : std::vector<topo::PoolUsage>{};
}

uint64_t StagingPlacement::booked() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t n = 0;
  for (const auto& [t, a] : tickets_) n += a.size;
  return n;
}

std::shared_ptr<topo::Placement> StagingPlacement::placement() const {
  std::lock_guard<std::mutex> lock(mu_);
  return placement_;
}

std::shared_ptr<const topo::Topology> ContextImpl::topology(std::string* why) const {
  std::lock_guard<std::mutex> lock(topo_mu_);
  if (!topo_tried_) {
    topo_tried_ = true;
    auto t = topo::discover_local(config_.get_string("sysfs_root"));
    if (t.ok())
      topo_ = *t;
    else
      topo_why_ = t.status().message();
  }
  *why = topo_why_;
  return topo_;
}

TransportList ContextImpl::transports() const {
  std::lock_guard<std::mutex> lock(mu_);
  return transports_;
}

void ContextImpl::register_transport(std::shared_ptr<Transport> t) {
  std::lock_guard<std::mutex> lock(mu_);
  dmx::register_transport(transports_, std::move(t));
}

Result<MemoryBudget::Charge> MemoryBudget::take(const std::shared_ptr<MemoryBudget>& b, uint64_t bytes,
                                                std::string_view peer, std::string_view what) {
  std::lock_guard<std::mutex> lock(b->mu_);
  uint64_t used = b->used_.load(std::memory_order_relaxed);
  uint64_t first = b->limit_ / 2;  // taken first come
  auto it = b->held_.find(std::string(peer));
  uint64_t mine = it == b->held_.end() ? 0 : it->second;
  uint64_t peers = b->held_.size() + (it == b->held_.end() ? 1 : 0);
  uint64_t share = (b->limit_ - first) / peers;
  bool fits = bytes <= b->limit_ && used <= b->limit_ - bytes;
  bool ok = fits && (used + bytes <= first || mine + bytes <= share);
  if (!ok)
    return Status(Code::kResourceExhausted,
                  fmt::format("peer {}: {} ({}) refused: this peer holds {} of this context's peer_memory_budget of "
                              "{} ({} held for all peers); past half of it a peer holds at most its share, {} ({} "
                              "peers hold memory)",
                              peer, what, format_size(bytes), format_size(mine), format_size(b->limit_),
                              format_size(used), format_size(share), peers));
  b->held_[std::string(peer)] = mine + bytes;
  b->used_.store(used + bytes, std::memory_order_relaxed);
  return Charge(b, std::string(peer), bytes);
}

void MemoryBudget::give_back(const std::string& peer, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  used_.fetch_sub(bytes, std::memory_order_relaxed);
  auto it = held_.find(peer);
  if (it == held_.end()) return;
  if (it->second <= bytes) held_.erase(it);
  else it->second -= bytes;
}

void ContextImpl::endpoint_started(const std::string& peer_key, const std::shared_ptr<EvictableEndpoint>& ep) {
  endpoints_.fetch_add(1, std::memory_order_relaxed);
  if (peer_key.empty()) return;
  std::lock_guard<std::mutex> lock(peers_mu_);
  PeerEndpoints& pe = per_peer_[peer_key];
  ++pe.count;
  pe.eps.emplace_back(ep.get(), ep);
}

void ContextImpl::endpoint_stopped(const std::string& peer_key, const EvictableEndpoint* ep) {
  endpoints_.fetch_sub(1, std::memory_order_relaxed);
  if (peer_key.empty()) return;
  std::lock_guard<std::mutex> lock(peers_mu_);
  auto it = per_peer_.find(peer_key);
  if (it == per_peer_.end()) return;
  std::erase_if(it->second.eps, [ep](const auto& e) { return e.first == ep; });
  if (--it->second.count <= 0) per_peer_.erase(it);
}

int ContextImpl::peer_endpoints(const std::string& peer_key) const {
  std::lock_guard<std::mutex> lock(peers_mu_);
  auto it = per_peer_.find(peer_key);
  return it == per_peer_.end() ? 0 : it->second.count;
}

Status ContextImpl::evict_idle_endpoint(const std::string& newcomer, const std::string& full, bool dry_run) {
  struct Candidate {
    std::string key;
    int count;
    std::vector<std::weak_ptr<EvictableEndpoint>> eps;
  };
  std::vector<Candidate> candidates;
  int mine = 0, most = 0;
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    if (auto it = per_peer_.find(newcomer); it != per_peer_.end()) mine = it->second.count;
    for (const auto& [key, pe] : per_peer_) {
      if (key == newcomer) continue;
      most = std::max(most, pe.count);
      if (pe.count <= mine + 1) continue;
      Candidate c{key, pe.count, {}};
      if (!dry_run)
        for (const auto& e : pe.eps) c.eps.push_back(e.second);
      candidates.push_back(std::move(c));
    }
  }
  if (dry_run && !candidates.empty()) return Status();
  // The peer that holds the most first; its oldest endpoint first. Evicted without peers_mu_ (the
  // endpoint takes its own lock, then this one).
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.count > b.count; });
  for (const auto& c : candidates)
    for (const auto& w : c.eps) {
      auto ep = w.lock();
      if (!ep) continue;
      Status why(Code::kResourceExhausted,
                 fmt::format("evicted for another peer: {}; peer {} held {} endpoints here, the most of any peer, "
                             "and this one was idle",
                             full, c.key, c.count));
      if (ep->evict_if_idle(why)) return Status();
    }
  std::string reason =
      candidates.empty()
          ? fmt::format("no other peer holds more than {} (this peer holds {}, the most any other holds is {}; a "
                        "peer keeps its fair share)",
                        mine + 1, mine, most)
          : "every endpoint of the peers that hold more than their share has work in flight or is new";
  return Status(Code::kResourceExhausted,
                fmt::format("the server refused peer {}: {}, and none could be evicted for it: {}", newcomer, full,
                            reason));
}

Status ContextImpl::admit_endpoint(uint16_t peer_streams, bool count_endpoints) const {
  if (peer_streams > params_.max_streams)
    return Status(Code::kResourceExhausted, fmt::format("{} streams asked; this side allows at most {} per endpoint "
                                                        "(max_streams)",
                                                        peer_streams, params_.max_streams));
  int live = live_endpoints();
  if (count_endpoints && live >= params_.max_endpoints)
    return Status(Code::kResourceExhausted,
                  fmt::format("{} endpoints are open, the most this context holds (max_endpoints)", live));
  return Status();
}

std::shared_ptr<Registered> ContextImpl::find_holder(const MemRegion& region) {
  constexpr int kScan = 64;  // a miss costs one attach, as before the lookup
  const auto a = reinterpret_cast<uintptr_t>(region.ptr);
  auto holds = [&](uint64_t key) -> std::shared_ptr<Registered> {
    auto it = regs_.find(key);
    if (it == regs_.end() || !(it->second->region.where == region.where)) return nullptr;
    const MemRegion& r = it->second->region;
    GtlbEntry e{reinterpret_cast<uintptr_t>(r.ptr), r.size, 0, key};
    return e.holds(a, region.size) ? it->second : nullptr;
  };
  if (auto hit = reg_gtlb_.lookup(a, region.size))
    if (auto reg = holds(hit->value)) return reg;
  auto it = reg_by_base_.upper_bound(a);
  for (int i = 0; i < kScan && it != reg_by_base_.begin(); ++i) {
    --it;
    if (auto reg = holds(it->second)) {
      reg_gtlb_.fill(GtlbEntry{it->first, reg->region.size, 0, it->second}, a, region.size);
      return reg;
    }
  }
  return nullptr;
}

std::shared_ptr<Registered> ContextImpl::add_registration(const MemRegion& region) {
  auto reg = std::make_shared<Registered>();
  reg->region = region;
  const bool indexed = region.ptr != nullptr && region.size > 0;
  std::shared_ptr<Registered> holder;
  if (indexed) {
    std::lock_guard<std::mutex> lock(mu_);
    holder = find_holder(region);
  }
  if (holder) {
    reg->attachments = holder->attachments;  // they live while any registration holds them
  } else if (region.size > 0) {  // an empty region has nothing to pin, export or bind: none
    for (const auto& t : transports())
      if (auto a = t->attach_registration(region)) reg->attachments.push_back(std::move(a));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (holder) ++reg_counts_.shared;
  else if (region.size > 0) ++reg_counts_.attached;
  do {
    reg->key = random_u64();  // unguessable: a key is a capability
  } while (reg->key == 0 || regs_.count(reg->key));
  regs_[reg->key] = reg;
  if (indexed) reg_by_base_.emplace(reinterpret_cast<uintptr_t>(region.ptr), reg->key);
  return reg;
}

ContextImpl::RegistrationCounts ContextImpl::registration_counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reg_counts_;
}

std::shared_ptr<Registered> ContextImpl::acquire_registration(uint64_t key,
                                                             const std::weak_ptr<RegistrationUser>& user) {
  std::shared_ptr<Registered> reg;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regs_.find(key);
    if (it == regs_.end()) return nullptr;
    reg = it->second;
  }
  std::lock_guard<std::mutex> lock(reg->mu);
  if (reg->withdrawn) return nullptr;
  ++reg->inflight;
  bool known = false;
  std::erase_if(reg->users, [&](const std::weak_ptr<RegistrationUser>& u) {
    if (!u.owner_before(user) && !user.owner_before(u)) known = true;
    return u.expired();
  });
  if (!known) reg->users.push_back(user);
  return reg;
}

void ContextImpl::release_registration(Registered& reg) {
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    --reg.inflight;
  }
  reg.cv.notify_all();
}

Status ContextImpl::remove_registration(Registered& reg) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (regs_.erase(reg.key) && reg.region.ptr != nullptr && reg.region.size > 0) {
      const auto base = reinterpret_cast<uintptr_t>(reg.region.ptr);
      for (auto [it, end] = reg_by_base_.equal_range(base); it != end; ++it)
        if (it->second == reg.key) {
          reg_by_base_.erase(it);
          break;
        }
      reg_gtlb_.invalidate(base, reg.region.size);  // others' translations there refill on a miss
    }
  }
  std::vector<std::shared_ptr<RegistrationUser>> users;
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    reg.withdrawn = true;  // no new operation acquires it from here on
    if (reg.inflight == 0) return Status();
    for (auto& u : reg.users)
      if (auto alive = u.lock()) users.push_back(std::move(alive));
  }
  // Without reg.mu: an endpoint takes its own lock, then releases registrations (which take reg.mu).
  for (auto& u : users) u->withdraw(reg);
  auto idle = [&] { return reg.inflight == 0; };
  std::unique_lock<std::mutex> lock(reg.mu);
  if (reg.cv.wait_for(lock, params_.deregister_timeout, idle)) return Status();
  // A byte still moving after the timeout: a peer that does not read (a read response stuck on a
  // full socket) or does not finish sending (a chunk in progress). Closing its endpoint stops it.
  Status why(Code::kResourceExhausted,
             fmt::format("the peer still used region 0x{:x} {} ms after it was deregistered; closing it", reg.key,
                         std::chrono::duration_cast<std::chrono::milliseconds>(params_.deregister_timeout).count()));
  lock.unlock();
  for (auto& u : users) u->abandon(why);
  lock.lock();
  // Closed endpoints' workers exit and let go within their own bounded shutdown.
  if (reg.cv.wait_for(lock, std::chrono::seconds(30), idle)) return Status();
  Status stuck(Code::kInternal, fmt::format("deregister: region 0x{:x} is still in use by {} transfers after their "
                                            "endpoints were closed; its memory must not be freed",
                                            reg.key, reg.inflight));
  DMX_LOG_ERROR("{}", stuck.message());
  return stuck;
}

// --- public handles ---

Result<Context> Context::create(const Options& options) {
  DMX_ASSIGN_OR_RETURN(auto impl, ContextImpl::create(options));
  Context c;
  c.impl_ = std::move(impl);
  return c;
}

Result<Endpoint> Context::connect(const std::string& address) {
  if (is_name_address(address)) {
    DMX_ASSIGN_OR_RETURN(auto ep, connect_by_name(impl_, address));
    return Endpoint(std::move(ep));
  }
  DMX_ASSIGN_OR_RETURN(auto ep, connect_endpoint(impl_, address));
  return Endpoint(std::move(ep));
}

Result<Registration> Context::register_memory(const MemRegion& region) {
  if (region.size > 0 && region.ptr == nullptr) return Status(Code::kInvalidArgument, "register_memory: null buffer");
  DMX_RETURN_IF_ERROR(mem_available(region.where));
  return Registration(impl_, impl_->add_registration(region));
}

Result<MemoryCharge> Context::charge_memory(uint64_t bytes, const std::string& peer, const std::string& what) {
  DMX_ASSIGN_OR_RETURN(MemoryBudget::Charge c, MemoryBudget::take(impl_->memory_budget(), bytes, peer, what));
  return MemoryCharge(std::make_shared<MemoryBudget::Charge>(std::move(c)));
}

Metrics Context::metrics() const { return impl_->metrics().snapshot(); }

Registration::Registration(std::shared_ptr<ContextImpl> ctx, std::shared_ptr<Registered> reg)
    : ctx_(std::move(ctx)), reg_(std::move(reg)) {}

Registration::~Registration() { (void)deregister(); }

MemSpec Registration::where() const { return reg_ ? reg_->region.where : MemSpec{}; }

Registration& Registration::operator=(Registration&& o) noexcept {
  if (this != &o) {
    (void)deregister();
    ctx_ = std::move(o.ctx_);
    reg_ = std::move(o.reg_);
  }
  return *this;
}

RemoteRegion Registration::remote() const {
  return reg_ ? RemoteRegion{reg_->key, reg_->region.size} : RemoteRegion{};
}

Status Registration::deregister() {
  Status s;
  if (reg_ && ctx_) s = ctx_->remove_registration(*reg_);
  reg_.reset();
  return s;
}

std::vector<unsigned char> RemoteRegion::serialize() const {
  std::vector<unsigned char> out(16);
  for (int i = 0; i < 8; ++i) {
    out[static_cast<size_t>(i)] = static_cast<unsigned char>(key >> (8 * i));
    out[static_cast<size_t>(8 + i)] = static_cast<unsigned char>(size >> (8 * i));
  }
  return out;
}

Result<RemoteRegion> RemoteRegion::parse(const unsigned char* data, size_t len) {
  if (data == nullptr || len != 16) return Status(Code::kInvalidArgument, "a remote region descriptor is 16 bytes");
  RemoteRegion r;
  for (int i = 7; i >= 0; --i) {
    r.key = (r.key << 8) | data[i];
    r.size = (r.size << 8) | data[8 + i];
  }
  return r;
}

void ContextImpl::add_rejoinable(uint64_t session, std::weak_ptr<EndpointImpl> ep) {
  std::lock_guard<std::mutex> lock(rejoin_mu_);
  rejoinable_[session] = std::move(ep);
}

void ContextImpl::remove_rejoinable(uint64_t session) {
  std::lock_guard<std::mutex> lock(rejoin_mu_);
  rejoinable_.erase(session);
}

std::shared_ptr<EndpointImpl> ContextImpl::find_rejoinable(uint64_t session) const {
  std::lock_guard<std::mutex> lock(rejoin_mu_);
  auto it = rejoinable_.find(session);
  return it == rejoinable_.end() ? nullptr : it->second.lock();
}

}  // namespace dmx
