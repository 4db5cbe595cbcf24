// mqueue/dispatcher_impl.h — the dispatcher's state (private to src/mqueue/dispatcher*.cc).
// Everything here is owned by the dispatcher thread, except the atomics and the stats mutex.
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mqueue/admission.h"
#include "mqueue/dispatcher.h"
#include "mqueue/net.h"

namespace dmx::mqueue {

// epoll user data: kind in the high 32 bits, index in the low.
enum class FdKind : uint32_t { kUdp = 1, kListen = 2, kConn = 3, kService = 4 };

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

// Where a request in a slot came from, to route its response (Lynx's client_md).
struct SlotMeta {
  bool udp = false;
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
  // dispatcher_calls.cc
  Status connect_services();
  bool forward_calls();
  void on_service(uint32_t w, uint32_t events);
  void fail_service(uint32_t w, const std::string& why);
  void reply_call(uint32_t w, uint32_t status, const uint8_t* data, uint32_t len);

  void watch(int fd, FdKind kind, uint32_t index, uint32_t events, bool modify = false);
};

}  // namespace dmx::mqueue
