// mqueue/dispatcher_impl.h — the dispatcher's state (private to src/mqueue/dispatcher*.cc).
// Everything here is owned by the dispatcher thread, except the atomics and the stats mutex.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dmx/context.h"
#include "mqueue/admission.h"
#include "mqueue/dispatcher.h"
#include "mqueue/net.h"

namespace dmx::mqueue {

// epoll user data: kind in the high 32 bits, index in the low.
enum class FdKind : uint32_t { kUdp = 1, kListen = 2, kConn = 3, kService = 4, kDmx = 5 };

// A TCP client. Lifecycle: kHeader -> kPayload -> kReady (a whole request waits for a slot) ->
// kHeader; any violation closes it (dropped, reported). `gen` tells a reused index apart.
struct Conn {
  enum class State : uint8_t { kHeader, kPayload, kReady };
  Fd fd;
  uint32_t gen = 0;
  bool open = false;
  std::string name;  // "tcp client 127.0.0.1:40000"
  std::string host;  // "127.0.0.1" (PeerCounts)
  std::chrono::steady_clock::time_point last_active;  // last byte in or answer out
  uint32_t in_flight = 0;  // its requests in the queues, not yet answered
  State state = State::kHeader;
  WireHeader hdr{};
  size_t got = 0;
  std::chrono::steady_clock::time_point begun;  // when the request being read began
  std::vector<uint8_t> payload;
  std::string out;  // responses not yet sent
  size_t out_off = 0;
  bool want_out = false;  // EPOLLOUT registered
};

// What dmx threads hand to the dispatcher thread: an accepted endpoint, an operation's
// completion, a write's notification, a remote ring let go of (dispatcher_dmx.cc).
struct DmxEvent {
  enum class Kind : uint8_t { kAccepted, kReceived, kSent, kNotified, kRingReleased };
  Kind kind = Kind::kAccepted;
  uint32_t peer = 0, gen = 0;  // kRingReleased: peer is the ring (worker)
  Status status;
  size_t bytes = 0;
  Notification note;
  std::shared_ptr<Endpoint> ep;  // kAccepted
};

// The queue of DmxEvents; push() from any thread wakes the dispatcher through an eventfd.
// Shared with the callbacks, which may outlive the dispatcher's state.
class DmxInbox {
 public:
  Status open();
  int fd() const { return wake_.get(); }
  void push(DmxEvent e);
  std::vector<DmxEvent> take();  // the dispatcher thread; also drains the eventfd

 private:
  Fd wake_;
  std::mutex mu_;  // guards events_
  std::vector<DmxEvent> events_;
};

// A dmx client. Lifecycle: open (kRequests: a recv posted; a whole request in rx waits for a
// slot while `ready`) -> optionally kRemote (a ring lent) -> closed (its endpoint, buffer and
// registration go to the closer thread). `gen` tells a reused index apart.
struct DmxPeer {
  enum class Mode : uint8_t { kRequests, kRemote };
  std::shared_ptr<Endpoint> ep;
  uint32_t gen = 0;
  bool open = false;
  Mode mode = Mode::kRequests;
  std::string name;  // "dmx client 127.0.0.1:40000 (host h, pid 7)"
  std::string host;  // PeerCounts key
  std::shared_ptr<Buffer> rx;  // WireHeader + max_request; the posted recv lands here
  bool ready = false;
  size_t ready_bytes = 0;
  uint32_t in_flight = 0;  // its requests in the queues, not yet answered
  size_t out_bytes = 0;    // answer bytes sent and not yet completed
  std::chrono::steady_clock::time_point last_active;
  // kRemote
  uint32_t ring = 0;
  std::shared_ptr<Registration> reg;  // the ring's slots, registered for this client alone
  uint64_t key = 0;
  uint32_t base_seq = 0;    // the ring's seq of the client's index 0
  uint32_t next_index = 0;  // the index its next notification must carry
  std::shared_ptr<std::atomic<uint32_t>> pending_notes;  // queued in the inbox, not yet checked
};

// A remote ring: lent to one peer, or free, or being let go of (its registration withdrawn and
// its endpoint closed off the dispatcher thread) and drained of the old client's requests.
struct RemoteRing {
  enum class State : uint8_t { kFree, kLent, kReleasing, kDraining };
  State state = State::kFree;
  uint32_t peer = 0;
};

// Closes endpoints and withdraws registrations off the dispatcher thread (both wait for dmx).
class Closer {
 public:
  Closer();
  ~Closer();  // runs what is queued, then joins
  void run(std::function<void()> job);

 private:
  void loop();
  std::mutex mu_;  // guards jobs_, quit_
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool quit_ = false;
  std::thread thread_;
};

// Where a request in a slot came from, to route its response (Lynx's client_md).
struct SlotMeta {
  enum class From : uint8_t { kTcp, kUdp, kDmx };  // kDmx: a DmxPeer, two-sided or remote
  From from = From::kTcp;
  uint32_t conn = 0, gen = 0;
  uint64_t tag = 0;
  SockAddr addr;
};

struct WorkerState {
  uint32_t issued = 0, collected = 0, credited = 0;         // server queue
  uint32_t calls_taken = 0, calls_credited = 0, replied = 0;  // client queue
  Fd svc;                 // connection to the external service
  std::string svc_name;   // "service 127.0.0.1:7000 (worker 3)"
  std::string svc_out;
  size_t svc_out_off = 0;
  WireHeader svc_hdr{};
  size_t svc_got = 0;
  std::vector<uint8_t> svc_in;
};

struct Dispatcher::Impl {
  QueueSet* q = nullptr;
  DispatcherConfig cfg;
  uint32_t batch = 1;
  Fd ep, udp, listen;
  SockAddr udp_addr, tcp_addr;
  std::vector<WorkerState> workers;
  std::vector<SlotMeta> meta;  // workers x slots
  std::vector<Conn> conns;
  std::vector<uint32_t> blocked;  // connections holding a whole request, oldest first
  uint32_t rr = 0;
  bool udp_blocked = false;
  std::chrono::steady_clock::time_point next_sweep;
  PeerCounts per_host;  // open conns by Conn::host
  std::chrono::steady_clock::time_point accept_paused_until;
  bool accept_paused = false;    // the listen socket is out of epoll until accept_paused_until
  EventLimiter log{[this](const std::string& s) { event(s); }};
  AcceptErrors accept_errors{"tcp", &log};  // named with the address once listening
  Status failure;  // first failure of a worker-memory copy; ends the loop

  // The dmx face (dispatcher_dmx.cc). Locals: workers [0, local_workers) take UDP, TCP and
  // two-sided dmx requests; the rest are remote rings.
  uint32_t local_workers = 0;
  std::unique_ptr<Context> ctx;
  std::unique_ptr<Listener> dmx_listener;
  std::string dmx_addr;
  std::shared_ptr<DmxInbox> inbox;
  std::thread acceptor;
  std::atomic<bool> accepting{true};
  std::unique_ptr<Closer> closer;
  std::vector<DmxPeer> peers;
  std::vector<uint32_t> dmx_blocked;  // peers holding a whole request, oldest first
  std::vector<RemoteRing> rings;      // remote_queues of them; ring r is worker local_workers + r

  std::atomic<bool> stop{false};
  std::thread thread;
  mutable std::mutex stats_mu;  // guards stats
  DispatcherStats stats;

  // dispatcher.cc
  void run();
  void event(const std::string& text);
  void count(uint64_t DispatcherStats::*field, uint64_t n = 1);
  int pick_worker();
  bool post(uint32_t w, uint32_t len, const SlotMeta& m);  // staging of issued[w] holds the request
  bool collect_responses();
  void flush_credits(uint32_t w);
  bool in_flight() const;
  // dispatcher_clients.cc
  void on_udp();
  void on_accept();
  void on_conn(uint32_t id, uint32_t events);
  bool advance_conn(uint32_t id);  // reads and posts; false once closed
  void retry_blocked();
  void drop_stalled();  // TCP clients stalled mid-request past request_timeout, or idle past idle_timeout
  void refuse(int fd, const SockAddr& peer, const std::string& why);
  void drop_conn(uint32_t id, const std::string& why);
  void send_response(const SlotMeta& m, uint32_t status, const uint8_t* payload, uint32_t len);
  void flush_conn(uint32_t id);
  // dispatcher_dmx.cc
  Status start_dmx();
  void stop_dmx();
  void accept_dmx();  // the acceptor thread
  bool on_dmx();      // handles the inbox; true if it did anything
  void on_dmx_accepted(std::shared_ptr<Endpoint> ep);
  void on_dmx_received(uint32_t id, const Status& st, size_t bytes);
  void on_dmx_notified(uint32_t id, const Notification& n);
  void post_dmx_recv(uint32_t id);
  bool advance_dmx(uint32_t id);  // a ready request into a slot; false when none free
  void retry_dmx_blocked();
  void grant_ring(uint32_t id);
  // `answer`: to a request of its (counted in and out of in_flight), not a grant or refusal.
  void send_dmx(uint32_t id, uint32_t magic, uint64_t tag, const void* payload, uint32_t len, bool answer);
  void drop_dmx(uint32_t id, const std::string& why);
  void sweep_dmx(std::chrono::steady_clock::time_point now);
  void refill_rings();  // let-go rings whose requests have all come back become free
  void count_lent();    // stats.remote_lent
  // dispatcher_calls.cc
  Status connect_services();
  bool forward_calls();
  void on_service(uint32_t w, uint32_t events);
  void fail_service(uint32_t w, const std::string& why);
  void reply_call(uint32_t w, uint32_t status, const uint8_t* data, uint32_t len);

  void watch(int fd, FdKind kind, uint32_t index, uint32_t events, bool modify = false);
};

}  // namespace dmx::mqueue
