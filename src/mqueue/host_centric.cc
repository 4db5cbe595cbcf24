#include "mqueue/host_centric.h"

#include <netinet/tcp.h>
#include <poll.h>
#include <sys/uio.h>

#include <cerrno>
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "mqueue/admission.h"
#include "mqueue/gpu_workers.h"
#include "mqueue/net.h"
#include "mqueue/request_header.h"

namespace dmx::mqueue {
namespace {

constexpr auto kPollStep = std::chrono::milliseconds(50);  // how soon a blocked thread sees stop

// The worker of one server thread, started once per request: a kernel launch on a GPU, a
// condition-variable hand-off to a worker thread on the CPU.
class Worker {
 public:
  static Result<std::unique_ptr<Worker>> create(MemSpec where, uint32_t max) {
    std::unique_ptr<Worker> w(new Worker());
    w->where_ = where;
    DMX_ASSIGN_OR_RETURN(w->in_, Buffer::allocate(where, std::max(max, 1u)));
    DMX_ASSIGN_OR_RETURN(w->out_, Buffer::allocate(where, std::max(max, 1u)));
    MemSpec stage{where.kind == MemKind::kCuda ? MemKind::kPinned : MemKind::kHost, 0};
    DMX_ASSIGN_OR_RETURN(w->stage_in_, Buffer::allocate(stage, std::max(max, 1u)));
    DMX_ASSIGN_OR_RETURN(w->stage_out_, Buffer::allocate(stage, std::max(max, 1u)));
    if (where.kind == MemKind::kCuda) {
      DMX_ASSIGN_OR_RETURN(w->gpu_, GpuLauncher::create(where.device));
    } else {
      w->thread_ = std::thread(&Worker::loop, w.get());
    }
    return w;
  }
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  uint8_t* stage_in() { return static_cast<uint8_t*>(stage_in_.data()); }
  uint8_t* stage_out() { return static_cast<uint8_t*>(stage_out_.data()); }

  // stage_in[0, len) -> worker memory -> computed -> stage_out[0, len).
  Status serve(uint32_t len) {
    if (len == 0) return Status();
    DMX_RETURN_IF_ERROR(copy_memory(in_.region().sub(0, len), stage_in_.region().sub(0, len)));
    if (gpu_) {
      DMX_RETURN_IF_ERROR(gpu_->run_xor(in_.data(), out_.data(), len));
    } else {
      std::unique_lock<std::mutex> lock(mu_);
      len_ = len;
      ++posted_;
      cv_.notify_all();
      if (!cv_.wait_for(lock, std::chrono::seconds(5), [&] { return done_ == posted_; }))
        return Status(Code::kTimeout, "host-centric worker did not answer in 5 s");
    }
    return copy_memory(stage_out_.region().sub(0, len), out_.region().sub(0, len));
  }

 private:
  Worker() = default;
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return quit_ || done_ != posted_; });
      if (quit_) return;
      auto* in = static_cast<const uint8_t*>(in_.data());
      auto* out = static_cast<uint8_t*>(out_.data());
      for (uint32_t i = 0; i < len_; ++i) out[i] = in[i] ^ kXorKey;
      done_ = posted_;
      cv_.notify_all();
    }
  }
  MemSpec where_;
  Buffer in_, out_, stage_in_, stage_out_;
  std::unique_ptr<GpuLauncher> gpu_;
  std::thread thread_;
  std::mutex mu_;  // guards len_, posted_, done_, quit_
  std::condition_variable cv_;
  uint32_t len_ = 0;
  uint64_t posted_ = 0, done_ = 0;
  bool quit_ = false;
};

}  // namespace

struct HostCentricServer::Impl {
  using Clock = std::chrono::steady_clock;
  // A connection's thread; `done` is set as its last act, so the accept thread can join it at once.
  struct ConnThread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };

  BaselineConfig cfg;
  Fd udp, listen;
  SockAddr udp_addr, tcp_addr;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> accepted{0}, requests{0}, refused{0}, dropped{0}, idle_closed{0}, accept_pauses{0};
  std::unique_ptr<std::atomic<uint64_t>[]> udp_served;  // per UDP server thread
  std::mutex mu;  // guards threads, conns, per_host
  std::vector<std::thread> threads;  // the UDP and accept threads
  std::list<ConnThread> conns;       // at most max_connections; finished ones reaped by accept_loop
  PeerCounts per_host;
  EventLimiter log{[this](const std::string& s) { event(s); }};

  void event(const std::string& text) {
    if (cfg.on_event) {
      cfg.on_event(text);
    } else {
      std::fprintf(stderr, "dmx mqueue baseline: %s\n", text.c_str());
    }
  }

  void udp_loop(uint32_t index) {
    auto w = Worker::create(cfg.memory, cfg.max_request);
    if (!w.ok()) return event("udp server: " + w.status().to_string());
    while (!stop.load()) {
      WireHeader h{};
      SockAddr from;
      iovec iov[2] = {{&h, sizeof h}, {(*w)->stage_in(), cfg.max_request}};
      msghdr msg{};
      msg.msg_name = &from.ss;
      msg.msg_namelen = sizeof from.ss;
      msg.msg_iov = iov;
      msg.msg_iovlen = 2;
      ssize_t n = ::recvmsg(udp.get(), &msg, 0);
      if (n < 0) continue;  // timeout: look at stop
      from.len = msg.msg_namelen;
      Framing framing{true, static_cast<uint64_t>(n), (msg.msg_flags & MSG_TRUNC) != 0};
      CheckedHeader ch = check_request_header(reinterpret_cast<const uint8_t*>(&h),
                                              std::min(static_cast<size_t>(n), sizeof h), cfg.max_request, framing);
      if (!ch.ok()) {
        log.emit("datagram", "dropped a datagram from udp client " + from.to_string() + ": " + ch.why);
        continue;
      }
      Status st = (*w)->serve(h.len);
      if (!st.ok()) return event("udp server: " + st.to_string());
      h.magic = kResponseMagic;
      iovec out[2] = {{&h, sizeof h}, {(*w)->stage_out(), h.len}};
      msghdr reply{};
      reply.msg_name = &from.ss;
      reply.msg_namelen = from.len;
      reply.msg_iov = out;
      reply.msg_iovlen = 2;
      (void)::sendmsg(udp.get(), &reply, 0);
      requests.fetch_add(1);
      udp_served[index].fetch_add(1, std::memory_order_relaxed);
    }
  }

  // Joins the connection threads that have finished (all of them once `all`).
  void reap(bool all) {
    std::list<ConnThread> finished;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto it = conns.begin(); it != conns.end();) {
        auto next = std::next(it);
        if (all || it->done->load(std::memory_order_acquire)) finished.splice(finished.end(), conns, it);
        it = next;
      }
    }
    for (auto& c : finished) c.thread.join();
  }

  void refuse(int fd, const SockAddr& peer, const std::string& why) {
    refuse_client(fd, peer, why, log);
    refused.fetch_add(1);
  }

  void accept_loop() {
    AcceptErrors errors("tcp " + tcp_addr.to_string(), &log);
    while (!stop.load()) {
      reap(/*all=*/false);
      pollfd p{listen.get(), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(kPollStep.count())) <= 0) continue;
      SockAddr peer;
      peer.len = sizeof peer.ss;
      int fd = ::accept4(listen.get(), reinterpret_cast<sockaddr*>(&peer.ss), &peer.len, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errors.failed(errno) == AcceptErrors::Next::kPause) {
          // The listen socket stays readable while we cannot accept: rest rather than spin.
          accept_pauses.fetch_add(1);
          std::this_thread::sleep_for(kAcceptPause);
        }
        continue;
      }
      errors.accepted();
      const std::string host = host_of(peer);
      std::string why;  // a refusal is sent and logged outside the lock: on_event may call stats()
      {
        std::lock_guard<std::mutex> lock(mu);
        if (per_host.count(host) >= cfg.max_per_address) {
          why = std::to_string(cfg.max_per_address) + " connections from " + host + " already (max_per_address)";
        } else if (conns.size() >= cfg.max_connections) {  // finished ones were reaped above
          why = std::to_string(cfg.max_connections) + " connections already (max_connections)";
        } else {
          per_host.add(host);
          accepted.fetch_add(1);
          auto done = std::make_shared<std::atomic<bool>>(false);
          conns.push_back(
              ConnThread{std::thread(&Impl::conn_thread, this, Fd(fd), peer.to_string(), host, done), done});
        }
      }
      if (!why.empty()) refuse(fd, peer, why);
    }
  }

  void conn_thread(Fd fd, std::string peer, std::string host, std::shared_ptr<std::atomic<bool>> done) {
    conn_loop(std::move(fd), peer);
    {
      std::lock_guard<std::mutex> lock(mu);
      per_host.remove(host);
    }
    done->store(true, std::memory_order_release);
  }

  // Reads exactly n bytes by `deadline`, seeing stop every kPollStep. kClosed on EOF before any.
  Status read_by(int fd, void* p, size_t n, Clock::time_point deadline, const std::string& what) {
    auto* c = static_cast<char*>(p);
    size_t got = 0;
    while (got < n) {
      if (stop.load()) return Status(Code::kClosed, "server stopping");
      if (Clock::now() >= deadline) return Status(Code::kTimeout, "request not whole in time");
      pollfd q{fd, POLLIN, 0};
      if (::poll(&q, 1, static_cast<int>(kPollStep.count())) <= 0) continue;
      ssize_t k = ::recv(fd, c + got, n - got, MSG_DONTWAIT);
      if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (k < 0) return Status(Code::kIo, "recv(" + what + ") failed: " + std::strerror(errno));
      if (k == 0)
        return Status(got == 0 ? Code::kClosed : Code::kIo,
                      what + " closed the connection" + (got ? " mid-message" : ""));
      got += static_cast<size_t>(k);
    }
    return Status();
  }

  // One thread per client, as conventional servers have (and its worker's thread on the CPU).
  void conn_loop(Fd fd, const std::string& peer) {
    const std::string name = "tcp client " + peer;
    auto w = Worker::create(cfg.memory, cfg.max_request);
    // Sends wait at most this long for a client that does not read its answers.
    (void)set_io_timeout(fd.get(), std::chrono::seconds(5));
    int one = 1;
    (void)::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (!w.ok()) log.emit("worker", name + ": " + w.status().to_string());
    auto idle_since = Clock::now();
    while (w.ok() && !stop.load()) {
      pollfd p{fd.get(), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(kPollStep.count())) <= 0) {
        if (Clock::now() - idle_since > cfg.idle_timeout) {
          idle_closed.fetch_add(1);
          log.emit("idle", "closed " + name + ": sent nothing for " +
                               std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(cfg.idle_timeout).count()) +
                               " ms (idle_timeout)");
          break;
        }
        continue;
      }
      const auto deadline = Clock::now() + cfg.request_timeout;
      WireHeader h{};
      Status st = read_by(fd.get(), &h, sizeof h, deadline, name);
      if (!st.ok()) {
        if (st.code() != Code::kClosed) drop(name, st.to_string());
        break;
      }
      CheckedHeader ch = check_request_header(reinterpret_cast<const uint8_t*>(&h), sizeof h, cfg.max_request);
      if (!ch.ok()) {
        drop(name, ch.why);
        break;
      }
      st = read_by(fd.get(), (*w)->stage_in(), h.len, deadline, name);
      if (st.code() == Code::kClosed) st = Status(Code::kIo, name + " closed the connection mid-message");
      if (st.ok()) st = (*w)->serve(h.len);
      h.magic = kResponseMagic;
      if (st.ok()) st = write_all(fd.get(), &h, sizeof h, name);
      if (st.ok()) st = write_all(fd.get(), (*w)->stage_out(), h.len, name);
      if (!st.ok()) {
        if (!stop.load()) drop(name, st.to_string());
        break;
      }
      requests.fetch_add(1);
      idle_since = Clock::now();
    }
  }

  void drop(const std::string& name, const std::string& why) {
    dropped.fetch_add(1);
    log.emit("drop", "dropped " + name + ": " + why);
  }
};

Result<std::unique_ptr<HostCentricServer>> HostCentricServer::start(BaselineConfig config) {
  auto impl = std::make_shared<Impl>();
  impl->cfg = std::move(config);
  if (!impl->cfg.udp.empty()) {
    DMX_ASSIGN_OR_RETURN(SockAddr a, resolve(impl->cfg.udp));
    DMX_ASSIGN_OR_RETURN(impl->udp, udp_bind(a));
    DMX_ASSIGN_OR_RETURN(impl->udp_addr, local_address(impl->udp.get()));
    // Every thread's recvmsg waits at most this long, so that it sees stop.
    DMX_RETURN_IF_ERROR(set_io_timeout(impl->udp.get(), kPollStep));
  }
  if (impl->cfg.udp_threads == 0 || impl->cfg.udp_threads > kMaxWorkers)
    return Status(Code::kInvalidArgument,
                  "host-centric baseline: udp_threads " + std::to_string(impl->cfg.udp_threads) + " not in 1.." +
                      std::to_string(kMaxWorkers));
  impl->udp_served = std::make_unique<std::atomic<uint64_t>[]>(impl->cfg.udp_threads);
  if (!impl->cfg.tcp.empty()) {
    DMX_ASSIGN_OR_RETURN(SockAddr a, resolve(impl->cfg.tcp));
    DMX_ASSIGN_OR_RETURN(impl->listen, tcp_listen(a));
    DMX_ASSIGN_OR_RETURN(impl->tcp_addr, local_address(impl->listen.get()));
  }
  // Fail now, not in a thread, if the worker memory cannot be had.
  DMX_RETURN_IF_ERROR(Worker::create(impl->cfg.memory, impl->cfg.max_request).status());
  std::lock_guard<std::mutex> lock(impl->mu);
  if (impl->udp.valid())
    for (uint32_t i = 0; i < impl->cfg.udp_threads; ++i) impl->threads.emplace_back(&Impl::udp_loop, impl.get(), i);
  if (impl->listen.valid()) impl->threads.emplace_back(&Impl::accept_loop, impl.get());
  return std::unique_ptr<HostCentricServer>(new HostCentricServer(impl));
}

HostCentricServer::~HostCentricServer() { stop(); }
std::string HostCentricServer::udp_address() const { return impl_->udp.valid() ? impl_->udp_addr.to_string() : ""; }
std::string HostCentricServer::tcp_address() const {
  return impl_->listen.valid() ? impl_->tcp_addr.to_string() : "";
}
uint64_t HostCentricServer::requests() const { return impl_->requests.load(); }

BaselineStats HostCentricServer::stats() const {
  BaselineStats s;
  s.accepted = impl_->accepted.load();
  s.requests = impl_->requests.load();
  s.refused_clients = impl_->refused.load();
  s.dropped_clients = impl_->dropped.load();
  s.idle_closed = impl_->idle_closed.load();
  s.accept_pauses = impl_->accept_pauses.load();
  if (impl_->udp.valid())
    for (uint32_t i = 0; i < impl_->cfg.udp_threads; ++i) s.udp_served.push_back(impl_->udp_served[i].load());
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (const auto& c : impl_->conns) s.connections += c.done->load() ? 0 : 1;
  return s;
}

void HostCentricServer::stop() {
  impl_->stop.store(true);
  std::vector<std::thread> ts;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    ts.swap(impl_->threads);
  }
  for (auto& t : ts) t.join();  // the accept thread adds no connection thread after this
  impl_->reap(/*all=*/true);
}

}  // namespace dmx::mqueue
