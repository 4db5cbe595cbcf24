#include "rpc/server.h"

#include <thread>
#include <vector>

#include "rpc/conn.h"
#include "rpc/server_shared.h"

namespace dmx::rpc {

// One thread accepts and reaps: it takes new peers (each gets a pool partition or is refused),
// checks request deadlines, and closes dead connections once no slot of theirs is at work.
class ServerImpl {
 public:
  ServerImpl(Context ctx, const ServerConfig& config) : ctx_(std::move(ctx)) { shared_.config = config; }
  ~ServerImpl() { stop(); }

  Status start(const std::string& address) {
    DMX_ASSIGN_OR_RETURN(shared_.pool, Pool::create(ctx_, shared_.config.pool));
    DMX_ASSIGN_OR_RETURN(shared_.orchestrator,
                         Orchestrator::create(shared_.config.orchestration, *shared_.pool,
                                              [](Job& job, const Status& s) { job.conn->finish(job, s); }));
    DMX_ASSIGN_OR_RETURN(listener_, ctx_.listen(address));
    address_ = listener_.address();
    thread_ = std::thread([this] { loop(); });
    return Status();
  }

  void stop() {
    if (stopping_.exchange(true)) return;
    if (thread_.joinable()) thread_.join();
    listener_.close();
    for (auto& c : conns_) c->close();
    if (shared_.orchestrator) shared_.orchestrator->stop();
    conns_.clear();
  }

  std::string address() const { return address_; }
  ServerStats stats() {
    ServerStats s;
    s.accepted = shared_.accepted;
    s.requests = shared_.requests;
    s.error_responses = shared_.error_responses;
    s.refused = shared_.refused;
    s.disconnects = shared_.disconnects;
    std::lock_guard<std::mutex> lock(shared_.mu);
    s.last_refusal = shared_.last_refusal;
    return s;
  }

 private:
  void loop() {
    while (!stopping_) {
      Result<Endpoint> ep = listener_.accept(std::chrono::milliseconds(20));
      if (ep.ok()) admit(std::move(*ep));
      else if (ep.status().code() != Code::kTimeout) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      auto now = std::chrono::steady_clock::now();
      for (auto it = conns_.begin(); it != conns_.end();) {
        (*it)->check_deadlines(now);
        if ((*it)->reapable()) {
          (*it)->close();
          it = conns_.erase(it);
        } else {
          ++it;
        }
      }
    }
  }

  void admit(Endpoint ep) {
    std::optional<uint32_t> part = shared_.pool->acquire_partition();
    if (!part && evict_idle(ep.peer())) part = shared_.pool->acquire_partition();
    if (!part) {
      shared_.note_refusal("refused peer " + ep.peer() + ": all " + std::to_string(shared_.config.pool.clients) +
                           " client partitions of the pool are in use");
      Header h;
      h.kind = Kind::kRefused;
      h.status = static_cast<uint32_t>(Code::kResourceExhausted);
      Wire w = encode_header(h);
      (void)ep.send(MemRegion{w.data(), w.size(), {}}, kTagCtrl).wait(std::chrono::milliseconds(200));
      (void)ep.close();
      return;
    }
    ++shared_.accepted;
    auto c = std::make_shared<Conn>(shared_, std::move(ep), *part);
    c->start();
    conns_.push_back(std::move(c));
  }

  // Every partition is taken: the client idle the longest, if for idle_evict_after or more, gives
  // its partition up to `newcomer`. True when one did.
  bool evict_idle(const std::string& newcomer) {
    auto now = std::chrono::steady_clock::now();
    std::shared_ptr<Conn> victim;
    std::chrono::steady_clock::duration longest{};
    for (auto& c : conns_) {
      auto idle = c->idle(now);
      if (idle >= shared_.config.idle_evict_after && idle > longest) {
        longest = idle;
        victim = c;
      }
    }
    if (!victim) return false;
    victim->evict("idle for " +
                  std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(longest).count()) +
                  " ms while every client partition was in use; given to " + newcomer);
    return true;
  }

  Context ctx_;
  ServerShared shared_;
  Listener listener_;
  std::string address_;
  std::vector<std::shared_ptr<Conn>> conns_;  // owned by the loop thread (then by stop())
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

Server::Server(std::unique_ptr<ServerImpl> impl) : impl_(std::move(impl)) {}
Server::~Server() = default;

Result<std::unique_ptr<Server>> Server::start(Context ctx, const std::string& address, const ServerConfig& config) {
  auto impl = std::make_unique<ServerImpl>(std::move(ctx), config);
  DMX_RETURN_IF_ERROR(impl->start(address));
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

std::string Server::address() const { return impl_->address(); }
ServerStats Server::stats() const { return impl_->stats(); }
void Server::stop() { impl_->stop(); }

}  // namespace dmx::rpc
