#include "mqueue/load.h"

#include <poll.h>
#include <sys/uio.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>

#include "mqueue/layout.h"
#include "mqueue/net.h"

namespace dmx::mqueue {
namespace {

using Clock = std::chrono::steady_clock;

struct Client {
  Fd fd;
  uint64_t tag = 0;
  bool busy = false;
  Clock::time_point sent;
  std::vector<uint8_t> req;
};

}  // namespace

double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double LoadResult::percentile(double p) const {
  if (latency_us.empty()) return 0;
  std::vector<double> v = latency_us;
  size_t k = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return v[k];
}

Result<LoadResult> run_load(const LoadConfig& cfg) {
  if (cfg.face != LoadConfig::Face::kSocket) return run_dmx_load(cfg);
  DMX_ASSIGN_OR_RETURN(SockAddr server, resolve(cfg.address));
  if (cfg.clients == 0 || cfg.sizes.empty()) return Status(Code::kInvalidArgument, "load: no clients or no sizes");
  std::mt19937_64 rng(cfg.seed);
  auto open = [&]() -> Result<Fd> {
    if (!cfg.udp) {
      DMX_ASSIGN_OR_RETURN(Fd fd, tcp_connect(server, cfg.timeout));
      DMX_RETURN_IF_ERROR(set_io_timeout(fd.get(), cfg.timeout));
      return fd;
    }
    Fd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!fd.valid() || ::connect(fd.get(), server.sa(), server.len) < 0)
      return Status(Code::kIo, "udp socket to " + server.to_string() + ": " + std::strerror(errno));
    return fd;
  };
  std::vector<Client> clients(cfg.clients);
  for (Client& c : clients) {
    DMX_ASSIGN_OR_RETURN(c.fd, open());
  }

  LoadResult r;
  uint32_t max_size = *std::max_element(cfg.sizes.begin(), cfg.sizes.end());
  std::vector<uint8_t> resp(size_t{max_size} + 64);
  const auto start = Clock::now();
  const double cpu0 = thread_cpu_seconds();
  const bool timed = cfg.duration.count() > 0;
  const auto end = start + std::chrono::duration_cast<Clock::duration>(cfg.duration);
  uint64_t next_tag = 1;
  auto fail = [&](const std::string& what) {
    if (r.first_error.empty()) r.first_error = what;
  };
  auto send = [&](Client& c) -> Status {
    uint64_t index = r.sent;
    c.req.resize(cfg.sizes[index % cfg.sizes.size()]);
    if (cfg.make) {
      cfg.make(c.req, index);
    } else {
      for (size_t i = 0; i < c.req.size(); i += 8) {
        uint64_t v = rng();
        std::memcpy(c.req.data() + i, &v, std::min<size_t>(8, c.req.size() - i));
      }
    }
    c.tag = next_tag++;
    WireHeader h{kRequestMagic, static_cast<uint32_t>(c.req.size()), c.tag};
    iovec iov[2] = {{&h, sizeof h}, {c.req.data(), c.req.size()}};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    c.sent = Clock::now();
    ssize_t n = ::sendmsg(c.fd.get(), &msg, MSG_NOSIGNAL);
    if (n != static_cast<ssize_t>(sizeof h + c.req.size()))
      return Status(Code::kIo, "load: send to " + server.to_string() + " failed: " + std::strerror(errno));
    c.busy = true;
    r.sent++;
    return Status();
  };
  auto more = [&] { return timed ? Clock::now() < end : r.sent < cfg.requests; };
  auto judge = [&](Client& c, const WireHeader& h, std::span<const uint8_t> payload) {
    c.busy = false;
    bool good = h.magic == kResponseMagic && h.len == payload.size() &&
                (cfg.check ? cfg.check(c.req, payload)
                           : payload.size() == c.req.size() &&
                                 std::equal(payload.begin(), payload.end(), c.req.begin(),
                                            [](uint8_t a, uint8_t b) { return a == (b ^ kXorKey); }));
    if (good) {
      r.ok++;
      r.latency_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - c.sent).count());
    } else {
      r.bad++;
      fail("a wrong answer to a " + std::to_string(c.req.size()) + " B request (magic " + std::to_string(h.magic) +
           ", " + std::to_string(h.len) + " B)");
    }
  };

  for (Client& c : clients)
    if (more()) DMX_RETURN_IF_ERROR(send(c));
  std::vector<pollfd> pfds(clients.size());
  for (;;) {
    bool any_busy = false;
    for (size_t i = 0; i < clients.size(); ++i) {
      pfds[i] = {clients[i].fd.get(), static_cast<short>(clients[i].busy ? POLLIN : 0), 0};
      any_busy |= clients[i].busy;
    }
    if (!any_busy) break;
    int n = ::poll(pfds.data(), pfds.size(), 10);
    if (n < 0 && errno != EINTR) return Status(Code::kIo, std::string("load: poll failed: ") + std::strerror(errno));
    const auto now = Clock::now();
    for (size_t i = 0; i < clients.size(); ++i) {
      Client& c = clients[i];
      if (!c.busy) continue;
      if (pfds[i].revents & (POLLIN | POLLERR | POLLHUP)) {
        WireHeader h{};
        if (cfg.udp) {
          iovec iov[2] = {{&h, sizeof h}, {resp.data(), resp.size()}};
          msghdr msg{};
          msg.msg_iov = iov;
          msg.msg_iovlen = 2;
          ssize_t k = ::recvmsg(c.fd.get(), &msg, MSG_DONTWAIT);
          if (k < 0) continue;  // e.g. ECONNREFUSED from an earlier datagram: wait for the timeout
          if (static_cast<size_t>(k) >= sizeof h && h.tag != c.tag) continue;  // late answer to a lost one
          size_t len = static_cast<size_t>(k) >= sizeof h ? static_cast<size_t>(k) - sizeof h : 0;
          judge(c, h, std::span<const uint8_t>(resp.data(), std::min(len, resp.size())));
        } else {
          Status st = read_all(c.fd.get(), &h, sizeof h, "server " + server.to_string());
          if (st.ok() && (h.len > resp.size() || h.tag != c.tag))
            st = Status(Code::kProtocol, "a response frame that does not fit (tag " + std::to_string(h.tag) + ")");
          if (st.ok()) st = read_all(c.fd.get(), resp.data(), h.len, "server " + server.to_string());
          if (!st.ok()) {
            c.busy = false;
            r.lost++;
            fail(st.to_string());
            DMX_ASSIGN_OR_RETURN(c.fd, open());
          } else {
            judge(c, h, std::span<const uint8_t>(resp.data(), h.len));
          }
        }
      } else if (now - c.sent > cfg.timeout) {
        c.busy = false;
        r.lost++;
        fail("no answer to a " + std::to_string(c.req.size()) + " B request in time");
        if (!cfg.udp) {
          DMX_ASSIGN_OR_RETURN(c.fd, open());
        }
      }
      if (!c.busy && more()) DMX_RETURN_IF_ERROR(send(c));
    }
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.client_cpu_seconds = thread_cpu_seconds() - cpu0;
  return r;
}

}  // namespace dmx::mqueue
