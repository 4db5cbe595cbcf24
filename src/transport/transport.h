// A transport: one way of moving an endpoint's bytes. Every endpoint has streams (src/stream/):
// stream 0 carries the control frames whatever moves the payload. A transport either moves
// payload on a path beside them (shm, cuda_ipc, devmem), or has its chunks ride the streams
// themselves (tcp: its data streams), or gives stream 0 another conduit (shm_pipe). The engine
// knows transports only through this interface and the registry of engine/transports.cc;
// each lives in its own folder (src/transport/<name>/).
//
// Connection set-up, the same for every transport (docs/wire.md):
//   1. offer(): each side, before its HELLO: usable here under this configuration (a descriptor
//      for the peer: addresses, keys, capabilities), or the precise reason why not.
//   2. HELLO carries the list of (name, descriptor). The server keeps a transport when both offer
//      it and compatible() says yes; it connects the transport's side channel when it needs one
//      (dropping the transport with the reason when that fails) and then asks admit().
//   3. Both sides take the transports the server's HELLO lists (in the server's registry order),
//      each checked against their own registry and compatible(): the same list on both sides, so
//      each transport's position in it is its path id on the wire (the chunk header's `path`
//      byte; 0 = inline on a stream). Which one a chunk takes is the sender's ranking
//      (engine/ranking.h), not this order.
//   4. connect(): both sides, once the streams joined, with a Bootstrap: the authenticated side
//      channel and extra TCP socket the transport asked for, and the facts of the session.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.h"
#include "core/config.h"
#include "core/sys.h"
#include "dmx/status.h"
#include "stream/conduit.h"
#include "transport/path.h"
#include "transport/side_channel.h"
#include "transport/striping.h"

namespace dmx {

// Bounds of names and descriptors on the wire: wire::kMaxOfferName, kMaxOfferDescriptor, kMaxOffers.

// What both sides know of each other from the two HELLOs: the same facts on both sides.
struct PeerPair {
  bool same_host = false;  // same boot id and host name
  bool same_pid = false;   // the HELLOs name one pid (within one host: maybe one process)
  uint32_t pid = 0;        // that pid, when same_pid
};

// What a transport needs from the engine to connect.
struct TransportNeeds {
  bool side_channel = false;  // an authenticated Unix socket to the peer (same host only)
  bool data_socket = false;   // one more authenticated TCP connection, for payload only
};

// Handed to connect(): what the engine set up for this transport.
class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual const Config& config() const = 0;
  virtual const std::string& peer() const = 0;
  // The side that connected: it creates shared regions, the other side maps them.
  virtual bool client() const = 0;
  virtual Deadline deadline() const = 0;
  // The kernel says the peer is this very process (SO_PEERCRED of a side channel).
  virtual bool same_process() const = 0;
  virtual const PeerPair& pair() const = 0;
  // The transport's side channel and data socket (TransportNeeds); each can be taken once.
  virtual Result<UnixChannel> side_channel() = 0;
  virtual Result<UniqueFd> data_socket() = 0;
};

// What an agreed transport gives the endpoint (Transport::gives).
enum class Gives : uint8_t {
  kPath,     // a payload path beside the streams: TransportLink::path
  kStreams,  // chunks inline on the endpoint's data streams (tcp); connect() makes nothing
  kControl,  // the conduit stream 0 runs on instead of its socket: TransportLink::control
};

// What connect() makes: a payload path beside the streams, and/or the conduit stream 0 runs on
// instead of its TCP socket (the shm control pipe).
struct TransportLink {
  std::unique_ptr<PayloadPath> path;
  std::unique_ptr<stream::Conduit> control;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Short, stable, on the wire and in statistics: "shm", "cuda_ipc", "devmem".
  virtual std::string_view name() const = 0;
  virtual TransportNeeds needs() const { return {}; }
  // The interface the connecting side binds its data socket to (SO_BINDTODEVICE) BEFORE connect,
  // so that its route leaves through it from the start ("" for none). Binding after connect would
  // reset the route (devmem TX checks the route's device).
  virtual std::string data_socket_device(const Config& config) const { return {}; }
  // Context::register_memory offers each registration here; what comes back is kept with the
  // registration and released with it (devmem: the region's TX binding, made on first use).
  virtual std::shared_ptr<void> attach_registration(const MemRegion& region) { return nullptr; }
  // Usable for a new endpoint of this side under `config` (the `transport` setting included):
  // the descriptor for the peer (≤ wire::kMaxOfferDescriptor bytes), or kUnavailable with the reason.
  virtual Result<std::vector<unsigned char>> offer(const Config& config) = 0;
  // Whether two sides that offered `a` and `b` can use it together, or the reason not. Must be
  // symmetric: compatible(a, b) and compatible(b, a) reach the same verdict. Peer input: a
  // malformed descriptor is a reason, never a crash.
  virtual Status compatible(std::span<const unsigned char> a, std::span<const unsigned char> b,
                            const PeerPair& pair) const = 0;
  // Server, after compatible() and the side channel: checks that need the kernel's word on the
  // peer (cuda_ipc within one process). kUnavailable drops the transport with the reason.
  virtual Status admit(const PeerPair& pair, bool same_process) const { return Status(); }
  // What it gives (above). The registry holds one kStreams transport: the one whose chunks go
  // inline when no path is agreed, and whose name the transport setting uses for "streams only".
  virtual Gives gives() const { return Gives::kPath; }
  // Gives::kStreams: how the inline chunks of an endpoint of more than one stream spread over
  // them (transport/striping.h). A kStreams transport must give one; others give none.
  virtual std::unique_ptr<Striping> striping(StripingSetup setup) const { return nullptr; }
  // For the session's reason: what goes this way ("device sources go by cuda_ipc").
  virtual std::string role(const PeerPair& pair) const = 0;
  // Where `dmx probe` says when the engine chooses it.
  virtual std::string when() const = 0;
  // The metrics row of operations this transport carried (the shm pipe counts as shm).
  virtual std::string_view metric_name() const { return name(); }
  virtual Result<TransportLink> connect(Bootstrap& b) = 0;
};

// Whether the `transport` setting lets this side offer `name`: "auto" or that name.
bool transport_allowed(const Config& config, std::string_view name);

// compatible() of a transport whose descriptor is one version byte: both are exactly `version`,
// else kUnavailable naming the transport.
Status same_version(std::string_view name, std::span<const unsigned char> a, std::span<const unsigned char> b,
                    unsigned char version);

}  // namespace dmx
