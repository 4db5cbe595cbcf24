// dmx/context.h — the entry point: configuration, listening, connecting, registering memory.
#pragma once

#include <memory>
#include <string>

#include "dmx/cluster.h"
#include "dmx/endpoint.h"
#include "dmx/metrics.h"
#include "dmx/options.h"

namespace dmx {

class ContextImpl;
class ListenerImpl;
struct Registered;

// Registered memory that peers may write into or read from. Move-only; destroying it (or
// calling deregister) withdraws the key, fails the peers' operations still using the memory (they
// see "not found: ... deregistered"), and returns once no transfer touches the memory any more;
// from then on it may be freed. A peer that does not let go within the deregister_timeout setting
// is closed.
class Registration {
 public:
  Registration() = default;
  Registration(std::shared_ptr<ContextImpl> ctx, std::shared_ptr<Registered> reg);
  ~Registration();
  Registration(Registration&&) noexcept = default;
  Registration& operator=(Registration&&) noexcept;
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

  RemoteRegion remote() const;  // what to give the peer
  MemSpec where() const;        // the memory's kind and device
  // Ok once no transfer uses the memory. An error only if dmx could not make sure of that (a
  // transfer still held it after its endpoints were closed): then the memory must not be freed.
  Status deregister();

 private:
  std::shared_ptr<ContextImpl> ctx_;
  std::shared_ptr<Registered> reg_;
};

// Memory the application holds on a peer's behalf (a buffer a peer's request made it allocate),
// counted in the context's peer_memory_budget together with every endpoint's unexpected eager
// data. Move-only; gives its bytes back when destroyed or released.
class MemoryCharge {
 public:
  MemoryCharge() = default;
  explicit MemoryCharge(std::shared_ptr<void> held) : held_(std::move(held)) {}
  void release() { held_.reset(); }

 private:
  std::shared_ptr<void> held_;
};

// Thread-safe. Move-only; destroying it stops accepting.
class Listener {
 public:
  Listener() = default;
  explicit Listener(std::shared_ptr<ListenerImpl> impl);
  ~Listener();
  Listener(Listener&&) noexcept = default;
  Listener& operator=(Listener&&) noexcept;

  // The next authenticated endpoint; Code::kTimeout when none arrives in time.
  Result<Endpoint> accept(Duration timeout = kForever);
  std::string address() const;  // "tcp://host:port" with the actual port
  void close();

 private:
  std::shared_ptr<ListenerImpl> impl_;
};

// Thread-safe; cheap to copy (a handle).
class Context {
 public:
  // Resolves the configuration (options > DMX_* environment > defaults) and the auth key.
  static Result<Context> create(const Options& options = {});

  Result<Listener> listen(const std::string& address);  // "tcp://host:port"; port 0: any
  // Connects and authenticates within the connect_timeout setting. "dmx://job/name" looks the
  // name up in the store (dmx/cluster.h) and connects to that process, checking in the handshake
  // that it is the name and epoch the store has (kAuth otherwise); its endpoint then fails with
  // kPeerFailed naming it as soon as the store shows it restarted or its lease ended.
  Result<Endpoint> connect(const std::string& address);
  // The store (dmx/cluster.h): publishes `registration` under `name` with where it lives (needs a
  // listener registered with store_name); lookup finds what a peer published (kNotFound; kAuth when
  // forged; kPeerFailed when stale: its owner restarted or is gone; kUnavailable when the store is
  // unreachable). kInvalidArgument without the store setting.
  Status publish(const std::string& name, const Registration& registration);
  Status unpublish(const std::string& name);
  Result<PublishedRegion> lookup(const std::string& name);
  Result<PeerInfo> lookup_peer(const std::string& name);
  Result<ClusterListing> cluster();
  // This process's epoch in the store (0 before it registered).
  uint64_t epoch() const;
  Result<Registration> register_memory(const MemRegion& region);
  // Charges `bytes` that `peer` makes the application hold (`what`: what they are for) to the
  // peer_memory_budget setting; kResourceExhausted naming the peer, the budget and what all peers
  // hold when it would be exceeded. Thread-safe.
  Result<MemoryCharge> charge_memory(uint64_t bytes, const std::string& peer, const std::string& what);
  // Counters and latency histograms of every endpoint this context made, closed ones included
  // (dmx/metrics.h, docs/metrics.md).
  Metrics metrics() const;

  std::shared_ptr<ContextImpl> impl() const { return impl_; }

 private:
  std::shared_ptr<ContextImpl> impl_;
};

}  // namespace dmx
