// The listener's state (listener.cc: accepting, caps and set-up threads; listener_handshake.cc:
// the server side of the handshake, frame by frame, and the endpoints it builds). Internal.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <list>
#include <thread>
#include <unordered_map>

#include "core/log.h"
#include "dmx/context.h"
#include "engine/handshake.h"
#include "engine/transport_setup.h"

namespace dmx {

// Endpoints being built at once (each a thread for at most handshake_timeout); beyond, refused.
constexpr size_t kMaxSetups = 64;
// Set-up threads in all, evicted ones not yet gone included; beyond, a new session is refused at
// AUTH (before its WELCOME), so a client never sees a handshake succeed that the server dropped.
constexpr size_t kMaxSetupThreads = 2 * kMaxSetups;

class ListenerImpl : public std::enable_shared_from_this<ListenerImpl> {
 public:
  static Result<std::shared_ptr<ListenerImpl>> create(std::shared_ptr<ContextImpl> ctx, const std::string& url);
  ~ListenerImpl();
  Result<Endpoint> accept(Duration timeout);
  const std::string& address() const { return address_; }
  void close();

 private:
  struct Conn {
    UniqueFd fd;
    std::string peer;
    std::string host;  // the peer's address without the port (per-address cap)
    Deadline deadline;
    unsigned char hdr[wire::kHeaderSize];
    size_t got = 0;
    bool in_payload = false;
    wire::FrameHeader h;
    std::vector<unsigned char> payload;
    uint64_t awaiting_auth = 0;  // session id whose AUTH this connection owes
    Clock::time_point since;     // accepted
    bool spoke() const { return got > 0 || in_payload || awaiting_auth != 0; }
  };
  struct Pending {  // an endpoint whose streams are still joining
    wire::Hello client, server;
    bool authed = false;
    std::vector<UniqueFd> fds;
    size_t joined = 0;
    Deadline deadline;
    std::string peer;
    std::string key;                // the peer for max_endpoints_per_peer: "address pid N"
    SideChannels channels;          // of the agreed transports that need one
    std::string why_not;            // reasons for transports not used
    std::vector<UniqueFd> data;     // data sockets: JOIN index fds.size() + k
    size_t expected() const { return fds.size() + data.size(); }
  };
  enum class Next { kKeep, kDrop, kTaken };

  explicit ListenerImpl(std::shared_ptr<ContextImpl> ctx) : ctx_(std::move(ctx)) {}
  void run();
  void accept_new();
  // Every removal from conns_ goes here: it keeps per_host_ true and drops a session that owed AUTH.
  std::list<Conn>::iterator drop_conn(std::list<Conn>::iterator it);
  Next read_conn(Conn& c);
  Next handle(Conn& c);
  Next on_hello(Conn& c);
  Next on_auth(Conn& c);
  Next on_join(Conn& c);
  Next on_rejoin(Conn& c);  // reconnect: a new stream of a live endpoint (endpoint/reconnect.cc)
  Next reject(Conn& c, const Status& why);
  // Best effort, no log line: tells the peer why it is dropped (a REJECT frame).
  static void tell(Conn& c, const Status& why);
  // Makes room for a new connection from `host`: at max_pending_per_address its oldest connection
  // (one that has sent nothing, else any), at max_pending_handshakes the oldest of all, is told why
  // and dropped.
  // False when the newcomer itself is refused: every connection of its address is younger than
  // kEvictGrace (evicting them would evict a client that has not had time to speak).
  bool make_room(const std::string& host, const std::string& newcomer);
  // kResourceExhausted naming max_endpoints_per_peer when `key` holds that many endpoints (open,
  // authenticated and joining, or being set up).
  Status check_peer_cap(const std::string& key) const;
  // At max_endpoints: makes room for one endpoint of peer `key` by evicting an idle endpoint of
  // the peer that holds the most (ContextImpl::evict_idle_endpoint; dry_run: only whether one
  // could be); kResourceExhausted saying why not.
  Status endpoint_room(const std::string& key, bool dry_run);
  void complete(uint64_t session);
  struct SetupState;
  void build(Pending p, Session agreed, std::shared_ptr<SetupState> state);  // a set-up thread
  void reap_setups(bool all);

  std::shared_ptr<ContextImpl> ctx_;
  UniqueFd fd_, wake_;
  std::string address_;
  std::string listen_host_;  // as asked: a wildcard takes streams on every interface (engine/links.h)
  std::thread thread_;
  // Listener thread only.
  std::list<Conn> conns_;  // oldest first
  std::unordered_map<std::string, size_t> per_host_;  // conns_ by Conn::host
  Clock::time_point accept_paused_until_;             // out of fds: the listen socket rests until then
  size_t max_pending_ = 1024, max_per_host_ = 64;     // from the configuration
  LogLimiter log_{std::chrono::seconds(1)};  // thread-safe
  // Threads building same-host paths, each bounded by its handshake deadline; joined by run().
  struct SetupState {
    std::mutex mu;           // guards the two flags
    bool committed = false;  // its endpoint is being created: no longer evicted
    bool evicted = false;    // cut: its sockets were shut down, it drops the endpoint
  };
  struct Setup {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
    std::shared_ptr<SetupState> state;
    std::vector<UniqueFd> cut;  // dups of its sockets and side channels: shutdown() ends its waits
    std::string peer, key;
    Clock::time_point started;
    bool active() const;  // neither done, committed nor evicted
  };
  // Evicts the oldest active set-up (for a newcomer, `why`); false when none can be.
  bool evict_oldest_setup(const std::string& newcomer);
  std::list<Setup> setups_;
  std::atomic<int> building_{0};  // set-up threads that have not yet created (or given up) their endpoint
  std::unordered_map<uint64_t, Pending> pending_;
  // Shared with accept().
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<EndpointImpl>> ready_;
  bool closed_ = false;
};

}  // namespace dmx
