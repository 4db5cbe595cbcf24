#include "mqueue/host_centric.h"

#include <netinet/tcp.h>
#include <poll.h>
#include <sys/uio.h>

#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "mqueue/gpu_workers.h"
#include "mqueue/net.h"

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
  BaselineConfig cfg;
  Fd udp, listen;
  SockAddr udp_addr, tcp_addr;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> requests{0};
  std::atomic<uint32_t> conns{0};
  std::mutex mu;  // guards threads
  std::vector<std::thread> threads;

  void event(const std::string& text) {
    if (cfg.on_event) {
      cfg.on_event(text);
    } else {
      std::fprintf(stderr, "dmx mqueue baseline: %s\n", text.c_str());
    }
  }

  void udp_loop() {
    auto w = Worker::create(cfg.memory, cfg.max_request);
    if (!w.ok()) return event("udp server: " + w.status().to_string());
    (void)set_io_timeout(udp.get(), kPollStep);
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
      if (static_cast<size_t>(n) < sizeof h || h.magic != kRequestMagic || (msg.msg_flags & MSG_TRUNC) ||
          h.len != static_cast<size_t>(n) - sizeof h) {
        event("dropped a bad datagram from udp client " + from.to_string());
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
    }
  }

  void accept_loop() {
    while (!stop.load()) {
      pollfd p{listen.get(), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(kPollStep.count())) <= 0) continue;
      SockAddr peer;
      peer.len = sizeof peer.ss;
      int fd = ::accept(listen.get(), reinterpret_cast<sockaddr*>(&peer.ss), &peer.len);
      if (fd < 0) continue;
      if (conns.load() >= cfg.max_connections) {
        ::close(fd);
        event("refused tcp client " + peer.to_string() + ": too many connections");
        continue;
      }
      conns.fetch_add(1);
      std::lock_guard<std::mutex> lock(mu);
      threads.emplace_back(&Impl::conn_loop, this, Fd(fd), peer.to_string());
    }
  }

  // One thread per client, as conventional servers have.
  void conn_loop(Fd fd, std::string peer) {
    const std::string name = "tcp client " + peer;
    auto w = Worker::create(cfg.memory, cfg.max_request);
    // A request, once begun, must arrive within this; between requests we poll for stop.
    (void)set_io_timeout(fd.get(), std::chrono::seconds(5));
    int one = 1;
    (void)::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (!w.ok()) event(name + ": " + w.status().to_string());
    while (w.ok() && !stop.load()) {
      pollfd p{fd.get(), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(kPollStep.count())) <= 0) continue;
      WireHeader h{};
      Status st = read_all(fd.get(), &h, sizeof h, name);
      if (!st.ok()) {
        if (st.code() != Code::kClosed) event("dropped " + name + ": " + st.to_string());
        break;
      }
      if (h.magic != kRequestMagic || h.len > cfg.max_request) {
        event("dropped " + name + ": bad header (length " + std::to_string(h.len) + ")");
        break;
      }
      st = read_all(fd.get(), (*w)->stage_in(), h.len, name);
      if (st.ok()) st = (*w)->serve(h.len);
      h.magic = kResponseMagic;
      if (st.ok()) st = write_all(fd.get(), &h, sizeof h, name);
      if (st.ok()) st = write_all(fd.get(), (*w)->stage_out(), h.len, name);
      if (!st.ok()) {
        event("dropped " + name + ": " + st.to_string());
        break;
      }
      requests.fetch_add(1);
    }
    conns.fetch_sub(1);
  }
};

Result<std::unique_ptr<HostCentricServer>> HostCentricServer::start(BaselineConfig config) {
  auto impl = std::make_shared<Impl>();
  impl->cfg = std::move(config);
  if (!impl->cfg.udp.empty()) {
    DMX_ASSIGN_OR_RETURN(SockAddr a, resolve(impl->cfg.udp));
    DMX_ASSIGN_OR_RETURN(impl->udp, udp_bind(a));
    DMX_ASSIGN_OR_RETURN(impl->udp_addr, local_address(impl->udp.get()));
  }
  if (!impl->cfg.tcp.empty()) {
    DMX_ASSIGN_OR_RETURN(SockAddr a, resolve(impl->cfg.tcp));
    DMX_ASSIGN_OR_RETURN(impl->listen, tcp_listen(a));
    DMX_ASSIGN_OR_RETURN(impl->tcp_addr, local_address(impl->listen.get()));
  }
  // Fail now, not in a thread, if the worker memory cannot be had.
  DMX_RETURN_IF_ERROR(Worker::create(impl->cfg.memory, impl->cfg.max_request).status());
  std::lock_guard<std::mutex> lock(impl->mu);
  if (impl->udp.valid()) impl->threads.emplace_back(&Impl::udp_loop, impl.get());
  if (impl->listen.valid()) impl->threads.emplace_back(&Impl::accept_loop, impl.get());
  return std::unique_ptr<HostCentricServer>(new HostCentricServer(impl));
}

HostCentricServer::~HostCentricServer() { stop(); }
std::string HostCentricServer::udp_address() const { return impl_->udp.valid() ? impl_->udp_addr.to_string() : ""; }
std::string HostCentricServer::tcp_address() const {
  return impl_->listen.valid() ? impl_->tcp_addr.to_string() : "";
}
uint64_t HostCentricServer::requests() const { return impl_->requests.load(); }

void HostCentricServer::stop() {
  impl_->stop.store(true);
  // Connection threads may still be added by the accept thread until it sees stop: join in rounds.
  for (;;) {
    std::vector<std::thread> ts;
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      ts.swap(impl_->threads);
    }
    if (ts.empty()) return;
    for (auto& t : ts) t.join();
  }
}

}  // namespace dmx::mqueue
