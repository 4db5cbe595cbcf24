// rpc/conn.h — the server side of one client connection: its control receives, its partition
// of pool slots, and the join of each request's header with the notification of its payload
// write (by token). Internal to src/rpc.
//
// Threads: dmx callbacks (control receives, write notifications, response sends), the
// orchestrator (finish; in cpu mode that is the callback's thread) and the server's reaper
// (deadlines, close). Callbacks hold weak references; the reaper closes and drops a connection once it is dead and no slot is at
// the orchestrator. mu_ guards the slot table and early notes; no call out under it.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dmx/endpoint.h"
#include "rpc/header.h"
#include "rpc/orchestrator.h"
#include "rpc/pool.h"

namespace dmx::rpc {

struct ServerShared;  // server.cc: pool, orchestrator, config, counters, log

class Conn : public std::enable_shared_from_this<Conn> {
 public:
  Conn(ServerShared& server, Endpoint ep, uint32_t partition);
  ~Conn();
  // Sends the hello and posts the receives. Call once, right after construction.
  void start();
  // The orchestrator's finish: sends the response (or an error header) and frees the slot.
  void finish(Job& job, const Status& status);
  // Refuses the peer: warns once naming it, tells it why, marks this connection dead.
  void refuse(const std::string& why);
  // Refuses the peer if a header has waited for its payload past the deadline.
  void check_deadlines(std::chrono::steady_clock::time_point now);
  bool dead() const { return dead_.load(); }
  bool reapable() const { return dead_.load() && busy_.load() == 0; }
  // How long it has had no request in progress (0 while it has one, or is dead).
  std::chrono::steady_clock::duration idle(std::chrono::steady_clock::time_point now);
  // Refuses the peer with `why` and closes it, giving its partition back (the server's loop only).
  void evict(const std::string& why);
  // Closes the endpoint (dmx touches the slots no more after it) and gives the partition back.
  void close();
  const std::string& peer() const { return peer_; }

 private:
  // Slot lifecycle: kFree -> kHeader (header here, payload notification awaited; a notification
  // that comes first waits in early_) -> kWork (at the orchestrator) -> kFree once the response
  // is posted. The client reuses a slot when it has the response, which may be before the send
  // completes here: a new header is welcome then, and the response area may be rewritten, as
  // its bytes have arrived (a client that does not wait only spoils its own response).
  enum class SlotState : uint8_t { kFree, kHeader, kWork };
  struct Slot {
    SlotState state = SlotState::kFree;
    Header hdr;
    std::chrono::steady_clock::time_point deadline;
  };
  struct EarlyNote {
    uint64_t token, length;
    std::chrono::steady_clock::time_point deadline;
  };

  void post_ctrl(uint32_t i);
  void on_ctrl(uint32_t i, const Status& s, size_t bytes);
  void on_note(const Notification& n);
  void on_sent(const Status& s);
  void peer_gone(const Status& s);
  // Under mu_: both halves are here; returns the job to submit, or an error to answer with.
  void ready_locked(uint32_t local, Job& job, Status& error);
  void send_header(const Header& h);

  ServerShared& server_;
  Endpoint ep_;
  std::string peer_;
  uint32_t partition_;
  uint64_t key_;  // the partition's registration key
  std::mutex mu_;  // guards slots_, early_
  std::vector<Slot> slots_;
  std::vector<EarlyNote> early_;  // at most one per slot
  std::vector<Wire> ctrl_bufs_;  // one per posted control receive; written only by dmx
  std::atomic<bool> dead_{false}, closed_{false};
  std::atomic<int64_t> last_active_{0};  // steady_clock ticks of the last header or response
  std::atomic<int> busy_{0};  // jobs at the orchestrator plus response sends in flight
};

}  // namespace dmx::rpc
