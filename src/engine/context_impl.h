// The shared state behind a Context handle.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/config.h"
#include "core/copy_crew.h"
#include "core/sys.h"
#include "dmx/context.h"
#include "engine/auth.h"
#include "engine/metrics.h"
#include "engine/transports.h"
#include "memory/gtlb.h"
#include "store/directory.h"
#include "stream/staging.h"
#include "stream/workers.h"
#include "topo/placement.h"
#include "topo/push.h"
#include "transport/path.h"

namespace dmx {

struct Registered;
class EndpointImpl;

// An endpoint that serves peers' operations on registered memory: deregistration asks it to end
// the operations that use a region, and closes it if they do not end in time.
class RegistrationUser {
 public:
  virtual ~RegistrationUser() = default;
  // Fails the peer's operations on `reg` (the peer is told); they let go of it once no byte of
  // theirs is still moving. Any thread but the user's own workers; no lock held.
  virtual void withdraw(Registered& reg) = 0;
  // Closes the endpoint with `why` (the peer held `reg` too long after its withdrawal).
  virtual void abandon(const Status& why) = 0;
};

// An endpoint of a listener, which the context may evict for a newcomer at max_endpoints.
class EvictableEndpoint {
 public:
  virtual ~EvictableEndpoint() = default;
  // Ends the endpoint with `why` (the peer is told in a CLOSE) if nothing is in flight on it either
  // way and it is older than kEvictGrace; false, and nothing done, otherwise. Any thread but the
  // endpoint's own workers; no context lock held.
  virtual bool evict_if_idle(const Status& why) = 0;
};

// Memory a peer may write into or read from. `inflight` counts transfers that use it;
// deregistration ends them and waits for it to reach 0.
struct Registered {
  uint64_t key = 0;
  MemRegion region;
  std::mutex mu;  // guards inflight, withdrawn, users
  std::condition_variable cv;
  int inflight = 0;
  bool withdrawn = false;
  std::vector<std::weak_ptr<RegistrationUser>> users;  // endpoints that acquired it (pruned on use)
  std::vector<std::shared_ptr<void>> attachments;     // Transport::attach_registration results
};

// Parameters one side proposes and enforces, derived from the configuration.
struct EngineParams {
  uint16_t streams = 4;
  uint16_t max_streams = 16;
  int max_endpoints = 256;
  int max_endpoints_per_peer = 64;
  uint64_t peer_memory_budget = uint64_t{1} << 30;
  uint32_t chunk_size = 1 << 20;
  uint32_t host_chunk_size = 256 << 10;  // small host messages on the streams (inline_chunk)
  uint64_t nt_receive_min = 4 << 20;     // host receives from this transfer size are bulk (RxPlan::bulk)
  uint32_t eager_limit = 16 << 10;
  uint64_t unexpected_budget = 64 << 20;
  int staging_slots = 4;
  int max_inflight_ops = 4096;
  uint64_t max_reply_backlog = 4 << 20;
  int peer_error_budget = 1000;
  size_t max_notifications = 65536;
  std::chrono::microseconds keepalive{1'000'000};
  std::chrono::microseconds peer_timeout{10'000'000};
  std::chrono::microseconds busy_peer_timeout{1'500'000};  // with operations pending
  std::chrono::microseconds connect_timeout{10'000'000};
  std::chrono::microseconds handshake_timeout{5'000'000};
  std::chrono::microseconds deregister_timeout{10'000'000};
  std::chrono::microseconds stop_timeout{30'000'000};
  int socket_buffer = 0;
  std::chrono::microseconds busy_poll{50};
  int stream_workers = 1;             // threads of the stream worker set (resolved from 0 = per CPU)
  int list_threads = 1;               // resolved from 0 = automatic
  bool workers_per_endpoint = false;  // stream_worker_scope=endpoint
  std::string transport = "auto";
  bool checksum = false;  // ask for per-chunk CRC32C (wire::Checksum)
  // GPU push of small staging copies (gpu_push, gpu_push_max; topo/push.h): device -> pinned
  // slot, and pinned slot -> device.
  topo::PushPlan push_tx, push_rx;
  uint8_t multilink = 1;  // wire::Multilink
  std::chrono::microseconds reconnect_timeout{0};  // 0: off (endpoint/reconnect.cc)
  std::string nics;       // interfaces the streams may use (engine/links.h); empty: all
};

// Places TCP staging memory with the machine's placement (topo/placement.h: pinned host pools per
// NUMA node, GPU pools per device with CUDA memory behind them when CUDA is present, published
// p2pmem BARs), shared by every context of this process with the same sysfs_root. Each device's
// staging goes to the host pool nearest to it by the P2PDMA rule, booked to this context until its
// staging pool frees it. Built on first use; when the topology cannot be read, says why once and
// places nothing.
class StagingPlacement final : public stream::StagingPlacer {
 public:
  explicit StagingPlacement(std::string sysfs_root) : sysfs_root_(std::move(sysfs_root)) {}
  int place(MemSpec device, size_t bytes, uint64_t* ticket) override;
  void unplace(uint64_t ticket) override;
  // Every pool of the machine's placement and its use (empty before first use or without
  // topology): the machine's, so other contexts' staging shows too.
  std::vector<topo::PoolUsage> usage() const;
  // Bytes of staging this context has booked.
  uint64_t booked() const;
  // The machine's placement (nullptr before first use or without topology).
  std::shared_ptr<topo::Placement> placement() const;
  // The same, built now if it was not (GPU pools here have CUDA memory behind them); nullptr
  // without topology.
  std::shared_ptr<topo::Placement> machine();

 private:
  void ensure_locked();
  const std::string sysfs_root_;
  mutable std::mutex mu_;  // guards placement_, tried_, tickets_, next_ticket_
  std::shared_ptr<topo::Placement> placement_;
  bool tried_ = false;
  std::unordered_map<uint64_t, topo::Allocation> tickets_;
  uint64_t next_ticket_ = 1;
  std::string name_;  // owner name for the books: "context <pid>/<n>"
};

// The context's one budget for the memory peers can make it hold (unexpected eager data of every
// endpoint, a bench plan's buffers): take() charges it or says why not, naming the peer and the
// budget; a Charge gives its bytes back when destroyed. Thread-safe (atomics).
// peer_memory_budget: what every peer together makes the context hold. The first half is taken
// first come; beyond it a peer is charged only within its share of the other half (that half
// divided among the peers holding memory), so the peers that spent the budget are the ones
// refused, and one that holds little still gets in. A peer holds at most half the budget when
// alone. Thread-safe.
class MemoryBudget {
 public:
  class Charge {
   public:
    Charge() = default;
    Charge(std::shared_ptr<MemoryBudget> b, std::string peer, uint64_t bytes)
        : budget_(std::move(b)), peer_(std::move(peer)), bytes_(bytes) {}
    Charge(Charge&& o) noexcept
        : budget_(std::move(o.budget_)), peer_(std::move(o.peer_)), bytes_(std::exchange(o.bytes_, 0)) {}
    Charge& operator=(Charge&& o) noexcept {
      if (this != &o) {
        reset();
        budget_ = std::move(o.budget_);
        peer_ = std::move(o.peer_);
        bytes_ = std::exchange(o.bytes_, 0);
      }
      return *this;
    }
    ~Charge() { reset(); }
    void reset() {
      if (budget_ && bytes_ > 0) budget_->give_back(peer_, bytes_);
      budget_.reset();
      bytes_ = 0;
    }
    uint64_t bytes() const { return bytes_; }

   private:
    std::shared_ptr<MemoryBudget> budget_;
    std::string peer_;
    uint64_t bytes_ = 0;
  };

  explicit MemoryBudget(uint64_t limit) : limit_(limit) {}
  // Charges `bytes` held for `peer` (`what`: what they are for, in the refusal); kResourceExhausted
  // naming the peer, what it holds, its share and the budget when the charge does not fit.
  static Result<Charge> take(const std::shared_ptr<MemoryBudget>& b, uint64_t bytes, std::string_view peer,
                             std::string_view what);
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  uint64_t limit() const { return limit_; }

 private:
  void give_back(const std::string& peer, uint64_t bytes);

  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};  // written under mu_; read without it
  std::mutex mu_;                  // guards held_ (a leaf)
  std::unordered_map<std::string, uint64_t> held_;  // by peer; only peers holding something
};

class ContextImpl : public std::enable_shared_from_this<ContextImpl> {
 public:
  static Result<std::shared_ptr<ContextImpl>> create(const Options& options);

  const Config& config() const { return config_; }
  const EngineParams& params() const { return params_; }
  const AuthKey& auth() const { return auth_; }
  const std::string& boot_id() const { return boot_id_; }
  const std::string& hostname() const { return hostname_; }
  stream::StagingPool& staging() { return staging_; }
  const StagingPlacement& placement() const { return placement_; }
  StagingPlacement& placement() { return placement_; }
  MetricsRegistry& metrics() { return metrics_; }
  // The threads that run every endpoint's streams (stream_worker_scope=context).
  stream::Workers& workers() { return workers_; }
  // The crew that checks and lays out long write and read lists (list_threads); null for one.
  CopyCrew* list_crew() { return list_crew_.get(); }
  const MetricsRegistry& metrics() const { return metrics_; }

  // The transports new endpoints may offer, in registry order (engine/transports.h; the order a
  // chunk tries them in is the session's ranking, engine/ranking.h).
  TransportList transports() const;
  // Puts a transport in place of the one of its name, or last: tests install doubles (devmem over
  // the socket-pair NIC) and test-only transports this way. Before listening or connecting.
  void register_transport(std::shared_ptr<Transport> t);

  // This host's topology (sysfs_root), read on first use for the transport ranking; null when it
  // cannot be read, with the reason in *why. Any thread.
  std::shared_ptr<const topo::Topology> topology(std::string* why) const;

  // Whether one more endpoint fits max_endpoints, and a peer asking for `peer_streams` streams fits
  // max_streams (0: our own connect, whose streams setting is ours to choose); kResourceExhausted
  // naming the setting when not. Any thread.
  // count_endpoints false: max_streams only (the listener checks max_endpoints itself, with eviction).
  Status admit_endpoint(uint16_t peer_streams, bool count_endpoints = true) const;
  // Endpoints count from creation until they fail, close or learn that their peer is gone
  // (EndpointImpl::release_slot), not until their threads have stopped. `peer_key`: the peer the
  // listener counts it under for max_endpoints_per_peer (empty: not counted per peer, never
  // evicted); `ep`: the endpoint, for evict_idle_endpoint.
  void endpoint_started(const std::string& peer_key, const std::shared_ptr<EvictableEndpoint>& ep);
  void endpoint_stopped(const std::string& peer_key, const EvictableEndpoint* ep);
  // Reconnect (endpoint/reconnect.cc): endpoints this side accepted that take REJOINs, by session
  // id; the listener routes a REJOIN to the live one. Any thread.
  void add_rejoinable(uint64_t session, std::weak_ptr<EndpointImpl> ep);
  void remove_rejoinable(uint64_t session);
  std::shared_ptr<EndpointImpl> find_rejoinable(uint64_t session) const;
  // At max_endpoints (`full` says so), makes room for one endpoint of peer `newcomer`: evicts an
  // idle endpoint (EvictableEndpoint) of the peer that holds the most, oldest first, but only of a
  // peer that holds more than the newcomer would (its count + 1): a peer is never evicted below
  // its fair share, so never of its only endpoint, and the newcomer never of its own. ok when one
  // was evicted; else kResourceExhausted saying why none could be. dry_run: only whether a peer
  // holds more than that (no endpoint is looked at; an unauthenticated newcomer must evict none).
  Status evict_idle_endpoint(const std::string& newcomer, const std::string& full, bool dry_run = false);
  int live_endpoints() const { return endpoints_.load(std::memory_order_relaxed); }
  int peer_endpoints(const std::string& peer_key) const;
  // The budget for memory peers make this context hold (peer_memory_budget).
  const std::shared_ptr<MemoryBudget>& memory_budget() const { return budget_; }

  // A new key for `region`. When a live registration of the same kind holds it whole (the same
  // region again, or a sub-range: the GTLB's lookup, then a scan of the registrations around its
  // address), the new one shares that one's transport attachments (rdma's MRs, devmem's TX
  // binding) and no transport is asked to attach anything.
  std::shared_ptr<Registered> add_registration(const MemRegion& region);
  struct RegistrationCounts {
    uint64_t attached = 0;  // registrations offered to the transports (Transport::attach_registration)
    uint64_t shared = 0;    // registrations that took a live one's attachments
  };
  RegistrationCounts registration_counts() const;
  // The registration for `key`, with its inflight count raised and `user` noted; nullptr when
  // unknown or withdrawn.
  std::shared_ptr<Registered> acquire_registration(uint64_t key, const std::weak_ptr<RegistrationUser>& user);
  static void release_registration(Registered& reg);
  // Withdraws the key, ends its users' operations on it, and waits until none uses the memory
  // (Registration::deregister's contract).
  Status remove_registration(Registered& reg);

  // The store (the `store` setting; engine/cluster.cc): nullptr without one.
  const std::shared_ptr<store::Directory>& directory() const { return directory_; }
  // Registers store_name with `address` when a name is set and not yet registered. Any thread.
  Status announce(const std::string& address);
  // This process's name and epoch in the store ("" and 0 when not registered): what HELLO says.
  std::string store_name() const { return directory_ && directory_->epoch() != 0 ? directory_->name() : ""; }
  uint64_t epoch() const { return directory_ ? directory_->epoch() : 0; }
  // Fails `ep` when the store shows its peer (session peer_name, peer_epoch) restarted or gone.
  void watch_peer(const std::string& name, uint64_t epoch, const std::shared_ptr<RegistrationUser>& ep);

 private:
  ContextImpl(Config config, EngineParams params, AuthKey auth);

  const Config config_;
  const EngineParams params_;
  const AuthKey auth_;
  std::string boot_id_, hostname_;
  StagingPlacement placement_;
  stream::StagingPool staging_;  // after placement_, which it uses
  // The live registration holding [ptr, +size) of kind `where`, or null. Caller holds mu_.
  std::shared_ptr<Registered> find_holder(const MemRegion& region);
  mutable std::mutex mu_;  // guards regs_, reg_by_base_, reg_gtlb_, reg_counts_, transports_
  std::unordered_map<uint64_t, std::shared_ptr<Registered>> regs_;
  std::multimap<uintptr_t, uint64_t> reg_by_base_;  // live registrations by first byte (key)
  Gtlb reg_gtlb_{Gtlb::Limits{.main_entries = 4096, .comp_blocks = 256}};  // address -> key
  RegistrationCounts reg_counts_;
  TransportList transports_;
  std::atomic<int> endpoints_{0};
  mutable std::mutex rejoin_mu_;  // guards rejoinable_ (a leaf)
  std::unordered_map<uint64_t, std::weak_ptr<EndpointImpl>> rejoinable_;
  mutable std::mutex peers_mu_;  // guards per_peer_ (a leaf: taken under EndpointImpl::mu_)
  struct PeerEndpoints {
    int count = 0;
    // Counted endpoints, oldest first.
    std::vector<std::pair<const EvictableEndpoint*, std::weak_ptr<EvictableEndpoint>>> eps;
  };
  std::unordered_map<std::string, PeerEndpoints> per_peer_;
  MetricsRegistry metrics_;
  stream::Workers workers_;
  std::shared_ptr<CopyCrew> list_crew_;
  std::shared_ptr<MemoryBudget> budget_;
  mutable std::mutex topo_mu_;  // guards topo_, topo_why_, topo_tried_ (a leaf)
  mutable std::shared_ptr<const topo::Topology> topo_;
  mutable std::string topo_why_;
  mutable bool topo_tried_ = false;
  std::mutex announce_mu_;                      // one registration at a time
  std::shared_ptr<store::Directory> directory_;  // last: destroyed first, with its thread
};

}  // namespace dmx
