// mqueue/dispatcher.h — the CPU "SmartNIC": terminates UDP and TCP from clients, writes each
// request into a worker's queue (payload first, flag last), collects responses from the
// response rings, sends them back, returns credits in batches, and forwards the workers' calls
// to an external service through their client queues.
//
// Clients speak WireHeader + payload (layout.h) per datagram or per TCP frame. Every byte from a
// client is checked: a datagram with a bad header, a length that disagrees with its size or is
// over the limit is dropped; a TCP client that sends a bad header or a length over the limit, or
// disconnects or stalls mid-request (request_timeout), is dropped; one idle for idle_timeout is
// closed; clients beyond max_connections, or max_per_address from one address, are refused with an
// error frame saying why. Each is reported through on_event naming the client (rate-limited), and
// the others go on. Out of fds, accepting rests for kAcceptPause instead of spinning. A full queue back-pressures: the request waits (in the socket for UDP,
// in its connection for TCP) until a credit frees a slot; nothing is overwritten.
//
// Thread-safety: one dispatcher thread owns all its state; stats() and stop() are safe from any
// thread. Lifetime: the QueueSet outlives the dispatcher; stop() joins within ~10 ms.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "dmx/options.h"
#include "dmx/request.h"
#include "mqueue/queues.h"

namespace dmx::mqueue {

enum class Policy { kRoundRobin, kLeastLoaded };

struct DispatcherConfig {
  std::string udp;      // "host:port" to bind (port 0: any); empty: no UDP
  std::string tcp;      // "host:port" to listen on; empty: no TCP
  // A dmx listener ("tcp://host:port"; port 0: any); empty: none. Its clients are dmx endpoints
  // (authenticated, with dmx's deadlines, peer-failure detection and transports): one message
  // per request, WireHeader + payload, answered the same way; or, after asking for one, a
  // remote queue written by one-sided writes (remote_queues; docs/mqueue.md).
  std::string dmx;
  // The dispatcher's own dmx Context (auth_key, peer_timeout, ...). max_endpoints and
  // max_endpoints_per_peer default to max_connections and max_per_address.
  Options dmx_options;
  // The last this many workers' rings are remote queues: each is lent to one dmx client at a time
  // and never receives the other faces' requests. 0: none.
  uint32_t remote_queues = 0;
  std::string service;  // external service for the client queues ("host:port"); empty: none
  Policy policy = Policy::kRoundRobin;
  uint32_t credit_batch = 0;         // responses per credit write-back; 0: slots / 2 (as Lynx)
  uint32_t max_connections = 256;    // TCP clients beyond this are refused (told why, then closed)
  // TCP clients from one address beyond this are refused: one host cannot take every slot.
  uint32_t max_per_address = 64;
  size_t max_tcp_backlog = 4u << 20;  // unsent response bytes per client before its reads pause
  Duration connect_timeout = std::chrono::seconds(2);  // to the external service
  Duration request_timeout = std::chrono::seconds(10);  // a TCP request begun must be whole by then
  // A TCP client with nothing in flight that sends nothing for this long is closed: idle
  // connections hold slots of max_connections. Far above a working client's pause between
  // requests, short enough that a lock-out by idle connections ends by itself.
  Duration idle_timeout = std::chrono::seconds(30);
  // Drops, refusals and failures, at most EventLimiter::kLinesPerKind a second of each kind
  // (admission.h); default: stderr.
  std::function<void(const std::string&)> on_event;
};

struct DispatcherStats {
  uint64_t requests = 0, responses = 0, error_responses = 0;
  uint64_t bad_datagrams = 0, dropped_clients = 0, refused_clients = 0;
  uint64_t idle_closed = 0;          // TCP clients closed after idle_timeout
  uint64_t accept_pauses = 0;        // times accepting rested for kAcceptPause (out of fds)
  uint64_t responses_discarded = 0;  // the client had gone
  uint64_t backpressure = 0;         // times a request waited for a free slot
  uint64_t credit_writes = 0;        // credit words written back to worker memory
  uint64_t calls = 0, call_failures = 0;
  uint64_t dmx_clients = 0;      // dmx endpoints accepted (the listener refuses beyond its caps)
  uint64_t remote_granted = 0;   // remote queues lent
  uint64_t remote_requests = 0;  // of requests: notified by remote clients' writes
  uint32_t remote_lent = 0;      // remote rings not free now (lent, or being let go of and drained)
  uint32_t max_occupancy = 0;        // most requests one worker held at once (<= slots)
  double cpu_seconds = 0;            // the dispatcher thread's CPU time (set when it ends)
};

class Dispatcher {
 public:
  static Result<std::unique_ptr<Dispatcher>> start(QueueSet* queues, DispatcherConfig config);
  ~Dispatcher();
  std::string udp_address() const;  // "127.0.0.1:port", empty without UDP
  std::string tcp_address() const;
  std::string dmx_address() const;  // "tcp://127.0.0.1:port", empty without dmx
  DispatcherStats stats() const;
  // Stops the thread; the result says if it had failed (an error of worker memory copies).
  Status stop();

  struct Impl;

 private:
  explicit Dispatcher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dmx::mqueue
