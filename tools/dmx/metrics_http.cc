// dmx bench --metrics-port (metrics_http.h): one poll() thread over the listener and at most
// kMaxConnections connections, each bounded in time and bytes.
#include "tools/dmx/metrics_http.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/log.h"
#include "core/sys.h"
#include "tools/dmx/metrics_request.h"

namespace dmx::cli {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A connection's lifecycle: kHead (reading the request head) -> kReply (writing the one reply)
// -> kLinger (write side shut; reading and dropping until the peer closes) -> closed. From any
// state it is closed at its deadline, on an error or end of stream, or when a newer connection
// evicts it.
enum class State { kHead, kReply, kLinger };

struct Conn {
  UniqueFd fd;
  std::string peer;   // "127.0.0.1:40000", for logs
  uint32_t addr = 0;  // the peer's IPv4 address, for the per-peer cap
  Clock::time_point accepted;
  Clock::time_point deadline;
  State state = State::kHead;
  std::string in;   // kHead: the bytes so far, at most kMaxRequestHead
  std::string out;  // kReply: the reply; `sent` of it written
  size_t sent = 0;
  size_t dropped = 0;  // kLinger: bytes read and dropped
  bool closed = false;
};

// Lines a peer can cause: one per kind per 10 s.
LogLimiter& limiter() {
  static LogLimiter l(std::chrono::seconds(10));
  return l;
}

std::string reply(int status, std::string_view content_type, const std::string& body, bool head_only) {
  std::string r = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n", status,
                              status_text(status), content_type, body.size());
  if (status == 405) r += "Allow: GET, HEAD\r\n";
  r += "Connection: close\r\n\r\n";
  if (!head_only) r += body;
  return r;
}

}  // namespace

struct MetricsServer::Impl {
  Context ctx;
  UniqueFd listener;
  UniqueFd wake;  // an eventfd: the destructor's stop
  std::atomic<bool> stop{false};
  std::thread thread;
  // Owned by the server thread from start() on.
  std::vector<Conn> conns;
  Clock::time_point accept_paused_until{};
  char scratch[16 * 1024];

  explicit Impl(Context c) : ctx(std::move(c)) {}
  void run();
  void accept_some(Clock::time_point now);
  void evict_for(uint32_t addr);
  void step(Conn& c, Clock::time_point now);
  void on_head(Conn& c, Clock::time_point now);
  void write_reply(Conn& c, Clock::time_point now);
};

void MetricsServer::Impl::run() {
  std::vector<pollfd> fds;
  while (!stop.load()) {
    Clock::time_point now = Clock::now();
    for (Conn& c : conns) {
      if (now < c.deadline) continue;
      if (c.state == State::kHead)
        DMX_LOG_LIMITED(limiter(), warn, "metrics head timeout",
                        "metrics port: closed {}: no complete request head within {} ms", c.peer, kHeadTimeout.count());
      else if (c.state == State::kReply)
        DMX_LOG_LIMITED(limiter(), warn, "metrics reply timeout",
                        "metrics port: closed {}: reply not taken within {} ms", c.peer, kReplyTimeout.count());
      c.closed = true;
    }
    std::erase_if(conns, [](const Conn& c) { return c.closed; });

    bool accepting = now >= accept_paused_until;
    fds.clear();
    fds.push_back({wake.get(), POLLIN, 0});
    fds.push_back({accepting ? listener.get() : -1, POLLIN, 0});
    Clock::time_point next = accepting ? Clock::time_point::max() : accept_paused_until;
    for (const Conn& c : conns) {
      fds.push_back({c.fd.get(), static_cast<short>(c.state == State::kReply ? POLLOUT : POLLIN), 0});
      next = std::min(next, c.deadline);
    }
    int timeout = -1;
    if (next != Clock::time_point::max())
      timeout = static_cast<int>(std::max<int64_t>(0, std::chrono::ceil<milliseconds>(next - now).count()));
    int n = ::poll(fds.data(), fds.size(), timeout);
    if (n < 0) {
      if (errno != EINTR) {
        DMX_LOG_LIMITED(limiter(), err, "metrics poll", "metrics port: poll failed: {}", errno_text(errno));
        std::this_thread::sleep_for(milliseconds(10));
      }
      continue;
    }
    if (fds[0].revents != 0) break;
    now = Clock::now();
    for (size_t i = 0; i < conns.size(); ++i)
      if (fds[i + 2].revents != 0) step(conns[i], now);
    std::erase_if(conns, [](const Conn& c) { return c.closed; });
    if (fds[1].revents != 0) accept_some(now);
  }
}

void MetricsServer::Impl::accept_some(Clock::time_point now) {
  for (int i = 0; i < 64; ++i) {  // a burst at a time, so that connections already held are served too
    sockaddr_in sa{};
    socklen_t len = sizeof(sa);
    int fd = ::accept4(listener.get(), reinterpret_cast<sockaddr*>(&sa), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
      // Out of descriptors (or memory): the pending connection stays queued in the kernel, so
      // poll() would wake at once again; stop looking at the listener for a while instead.
      accept_paused_until = now + kAcceptPause;
      DMX_LOG_LIMITED(limiter(), warn, "metrics accept", "metrics port: accept failed: {}; not accepting for {} ms",
                      errno_text(err), kAcceptPause.count());
      return;
    }
    char ip[INET_ADDRSTRLEN] = "?";
    ::inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
    evict_for(sa.sin_addr.s_addr);
    Conn& c = conns.emplace_back();
    c.fd.reset(fd);
    c.peer = fmt::format("{}:{}", ip, ntohs(sa.sin_port));
    c.addr = sa.sin_addr.s_addr;
    c.accepted = now;
    c.deadline = now + kHeadTimeout;
    // A scraper sends its request at once: serve it now, before a burst of newer connections
    // could evict it.
    step(c, now);
    if (c.closed) conns.pop_back();
  }
}

// Makes room for one more connection from `addr`: closes the oldest of that address when it holds
// kMaxConnectionsPerPeer, else the oldest of all when kMaxConnections are held. Connections still
// waiting for their head go first: a scrape being answered is the last to be cut.
void MetricsServer::Impl::evict_for(uint32_t addr) {
  size_t same = std::count_if(conns.begin(), conns.end(), [addr](const Conn& c) { return c.addr == addr; });
  bool per_peer = same >= kMaxConnectionsPerPeer;
  if (!per_peer && conns.size() < kMaxConnections) return;
  auto victim = conns.end();
  for (auto it = conns.begin(); it != conns.end(); ++it) {
    if (per_peer && it->addr != addr) continue;
    if (victim == conns.end()) {
      victim = it;
      continue;
    }
    bool it_head = it->state == State::kHead, victim_head = victim->state == State::kHead;
    if ((it_head && !victim_head) || (it_head == victim_head && it->accepted < victim->accepted)) victim = it;
  }
  if (victim == conns.end()) return;
  DMX_LOG_LIMITED(limiter(), warn, "metrics evict",
                  "metrics port: {} connections held ({} from this address; at most {}, {} per address): closed the "
                  "oldest, {}",
                  conns.size(), same, kMaxConnections, kMaxConnectionsPerPeer, victim->peer);
  conns.erase(victim);
}

// What poll() reported (or an optimistic try right after accept): one step of the lifecycle.
void MetricsServer::Impl::step(Conn& c, Clock::time_point now) {
  if (c.state == State::kReply) return write_reply(c, now);
  size_t room = c.state == State::kHead ? kMaxRequestHead - c.in.size() : sizeof(scratch);
  ssize_t n = ::recv(c.fd.get(), scratch, std::min(room, sizeof(scratch)), 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0) {  // end of stream or an error (a reset peer): nothing to answer
    c.closed = true;
    return;
  }
  auto got = static_cast<size_t>(n);
  if (c.state == State::kLinger) {
    c.dropped += got;
    if (c.dropped > kLingerBytes) c.closed = true;
    return;
  }
  c.in.append(scratch, got);
  // A verdict needs a new line end, or a full head buffer.
  if (std::memchr(scratch, '\n', got) != nullptr || c.in.size() >= kMaxRequestHead) on_head(c, now);
}

void MetricsServer::Impl::on_head(Conn& c, Clock::time_point now) {
  RequestHead h = parse_request_head(c.in);
  if (h.verdict == RequestHead::Verdict::kNeedMore) return;
  if (h.verdict == RequestHead::Verdict::kServe) {
    c.out = reply(200, "text/plain; version=0.0.4; charset=utf-8", to_prometheus(ctx.metrics()), h.head_only);
  } else {
    DMX_LOG_LIMITED(limiter(), warn, "metrics refused", "metrics port: refused a request from {}: {} {}", c.peer,
                    h.status, h.reason);
    c.out = reply(h.status, "text/plain; charset=utf-8", std::string(h.reason) + "\n", false);
  }
  c.in = std::string();
  c.state = State::kReply;
  c.deadline = now + kReplyTimeout;
  write_reply(c, now);
}

void MetricsServer::Impl::write_reply(Conn& c, Clock::time_point now) {
  while (c.sent < c.out.size()) {
    ssize_t n = ::send(c.fd.get(), c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      c.closed = true;
      return;
    }
    c.sent += static_cast<size_t>(n);
  }
  // All written: shut the write side and drop what the peer still sends (a refused body, say)
  // until it closes, so that it reads the reply rather than a reset.
  c.out = std::string();
  ::shutdown(c.fd.get(), SHUT_WR);
  c.state = State::kLinger;
  c.deadline = now + kLingerTimeout;
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(Context ctx, int port) {
  if (port < 0 || port > 65535)
    return Status(Code::kInvalidArgument, fmt::format("--metrics-port {}: not a port", port));
  auto impl = std::make_unique<Impl>(std::move(ctx));
  auto fail = [port](std::string_view call) {
    return Status(Code::kIo, fmt::format("--metrics-port: cannot listen on 127.0.0.1:{}: {} failed: {}", port, call,
                                         errno_text(errno)));
  };
  impl->listener.reset(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!impl->listener.valid()) return fail("socket");
  int one = 1;
  ::setsockopt(impl->listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(impl->listener.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) return fail("bind");
  if (::listen(impl->listener.get(), 64) != 0) return fail("listen");
  socklen_t len = sizeof(sa);
  if (::getsockname(impl->listener.get(), reinterpret_cast<sockaddr*>(&sa), &len) != 0) return fail("getsockname");
  impl->wake.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl->wake.valid()) return fail("eventfd");
  Impl* p = impl.get();
  p->thread = std::thread([p] { p->run(); });
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl), ntohs(sa.sin_port)));
}

MetricsServer::~MetricsServer() {
  impl_->stop.store(true);
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(impl_->wake.get(), &one, sizeof(one));
  impl_->thread.join();
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl, int port) : impl_(std::move(impl)), port_(port) {}

}  // namespace dmx::cli
