// The client side of the dispatcher: UDP datagrams and TCP connections, checked byte by byte.
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "mqueue/dispatcher_impl.h"

namespace dmx::mqueue {
namespace {

std::string hex(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", v);
  return b;
}

}  // namespace

void Dispatcher::Impl::on_udp() {
  const Layout& l = q->layout();
  udp_blocked = false;
  for (int i = 0; i < 64; ++i) {
    int w = pick_worker();
    if (w < 0) {
      // Every ring is full: leave datagrams in the socket until a credit frees a slot.
      if (!udp_blocked) count(&DispatcherStats::backpressure);
      udp_blocked = true;
      return;
    }
    WorkerState& ws = workers[w];
    uint8_t* slot = q->staging_for(l.rx_slot(w, ws.issued & (l.g.slots - 1)));
    WireHeader wh{};
    SlotMeta m;
    m.udp = true;
    iovec iov[2] = {{&wh, sizeof wh}, {slot + sizeof(SlotHeader), l.g.max_request}};
    msghdr msg{};
    msg.msg_name = &m.addr.ss;
    msg.msg_namelen = sizeof m.addr.ss;
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    ssize_t n = ::recvmsg(udp.get(), &msg, MSG_DONTWAIT);
    if (n < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        event(std::string("recvmsg(udp) failed: ") + std::strerror(errno));
      return;
    }
    m.addr.len = msg.msg_namelen;
    std::string why;
    if (static_cast<size_t>(n) < sizeof wh) {
      why = std::to_string(n) + " B, shorter than the 16-byte header";
    } else if (wh.magic != kRequestMagic) {
      why = "bad magic " + hex(wh.magic);
    } else if (msg.msg_flags & MSG_TRUNC) {
      why = "over the " + std::to_string(l.g.max_request) + " B request limit";
    } else if (wh.len != static_cast<size_t>(n) - sizeof wh) {
      why = "header says " + std::to_string(wh.len) + " B, datagram has " + std::to_string(n - sizeof wh);
    }
    if (!why.empty()) {
      uint64_t bad;
      {
        std::lock_guard<std::mutex> lock(stats_mu);
        bad = ++stats.bad_datagrams;
      }
      if (bad <= 16 || bad % 1024 == 0)  // a flood must not flood the log
        event("dropped a datagram from udp client " + m.addr.to_string() + ": " + why + " (" +
              std::to_string(bad) + " so far)");
      continue;
    }
    m.tag = wh.tag;
    if (!post(static_cast<uint32_t>(w), wh.len, m)) return;
  }
}

void Dispatcher::Impl::on_accept() {
  for (;;) {
    SockAddr peer;
    peer.len = sizeof peer.ss;
    int fd = ::accept4(listen.get(), reinterpret_cast<sockaddr*>(&peer.ss), &peer.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
        event(std::string("accept failed: ") + std::strerror(errno));
      return;
    }
    uint32_t id = 0;
    while (id < conns.size() && conns[id].open) ++id;
    if (id >= cfg.max_connections) {
      ::close(fd);
      count(&DispatcherStats::refused_clients);
      event("refused tcp client " + peer.to_string() + ": " + std::to_string(cfg.max_connections) +
            " connections already");
      continue;
    }
    if (id == conns.size()) conns.emplace_back();
    Conn& c = conns[id];
    uint32_t gen = c.gen + 1;
    c = Conn{};
    c.fd = Fd(fd);
    c.gen = gen;
    c.open = true;
    c.name = "tcp client " + peer.to_string();
    int one = 1;
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    watch(fd, FdKind::kConn, id, EPOLLIN | EPOLLRDHUP);
  }
}

void Dispatcher::Impl::drop_conn(uint32_t id, const std::string& why) {
  Conn& c = conns[id];
  if (!c.open) return;
  if (!why.empty()) {
    count(&DispatcherStats::dropped_clients);
    event("dropped " + c.name + ": " + why);
  }
  (void)::epoll_ctl(ep.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
  c.fd.reset();
  c.open = false;
  c.payload = {};
  c.out = {};
  // Its responses still in the queues are discarded when they come (gen no longer matches).
}

void Dispatcher::Impl::on_conn(uint32_t id, uint32_t events) {
  if (id >= conns.size() || !conns[id].open) return;
  if (events & EPOLLOUT) flush_conn(id);
  if (!conns[id].open) return;
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) advance_conn(id);
}

bool Dispatcher::Impl::advance_conn(uint32_t id) {
  const Layout& l = q->layout();
  for (int frames = 0; frames < 16; ++frames) {
    Conn& c = conns[id];
    if (c.out.size() - c.out_off > cfg.max_tcp_backlog) return true;  // let it read its answers first
    if (c.state == Conn::State::kReady) {
      int w = pick_worker();
      if (w < 0) {
        bool listed = false;
        for (uint32_t b : blocked) listed |= b == id;
        if (!listed) {
          blocked.push_back(id);
          count(&DispatcherStats::backpressure);
        }
        return true;
      }
      const uint32_t len = c.hdr.len;
      uint8_t* slot = q->staging_for(l.rx_slot(w, workers[w].issued & (l.g.slots - 1)));
      if (len) std::memcpy(slot + sizeof(SlotHeader), c.payload.data(), len);
      SlotMeta m;
      m.conn = id;
      m.gen = c.gen;
      m.tag = c.hdr.tag;
      c.state = Conn::State::kHeader;
      c.got = 0;
      if (!post(static_cast<uint32_t>(w), len, m)) return false;
      continue;
    }
    uint8_t* dst;
    size_t want;
    if (c.state == Conn::State::kHeader) {
      dst = reinterpret_cast<uint8_t*>(&c.hdr) + c.got;
      want = sizeof c.hdr - c.got;
    } else {
      dst = c.payload.data() + c.got;
      want = c.hdr.len - c.got;
    }
    ssize_t n = ::recv(c.fd.get(), dst, want, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return true;
      drop_conn(id, std::string("recv failed: ") + std::strerror(errno));
      return false;
    }
    if (n == 0) {
      if (c.state == Conn::State::kHeader && c.got == 0) {
        drop_conn(id, "");  // an orderly goodbye between requests
      } else {
        drop_conn(id, "disconnected mid-request (" + std::to_string(c.got) + " of " +
                          std::to_string(c.state == Conn::State::kHeader ? sizeof c.hdr : c.hdr.len) +
                          (c.state == Conn::State::kHeader ? " header" : " payload") + " bytes)");
      }
      return false;
    }
    if (c.state == Conn::State::kHeader && c.got == 0) c.begun = std::chrono::steady_clock::now();
    c.got += static_cast<size_t>(n);
    if (c.state == Conn::State::kHeader && c.got == sizeof c.hdr) {
      if (c.hdr.magic != kRequestMagic) {
        drop_conn(id, "bad magic " + hex(c.hdr.magic));
        return false;
      }
      if (c.hdr.len > l.g.max_request) {
        drop_conn(id, "request length " + std::to_string(c.hdr.len) + " over the limit " +
                          std::to_string(l.g.max_request));
        return false;
      }
      if (c.payload.size() < c.hdr.len) c.payload.resize(c.hdr.len);
      c.got = 0;
      c.state = c.hdr.len ? Conn::State::kPayload : Conn::State::kReady;
    } else if (c.state == Conn::State::kPayload && c.got == c.hdr.len) {
      c.state = Conn::State::kReady;
    }
  }
  return true;
}

void Dispatcher::Impl::drop_stalled() {
  auto now = std::chrono::steady_clock::now();
  if (now < next_sweep) return;
  next_sweep = now + std::chrono::milliseconds(50);
  for (uint32_t id = 0; id < conns.size(); ++id) {
    const Conn& c = conns[id];
    // kReady is waiting for us, not for the client; kHeader with nothing read is idle.
    bool reading = c.state == Conn::State::kPayload || (c.state == Conn::State::kHeader && c.got > 0);
    if (c.open && reading && now - c.begun > cfg.request_timeout)
      drop_conn(id, "stalled mid-request (" + std::to_string(c.got) + " bytes of the " +
                        (c.state == Conn::State::kHeader ? "header" : "payload") + " in " +
                        std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(cfg.request_timeout).count()) +
                        " ms)");
  }
}

void Dispatcher::Impl::retry_blocked() {
  std::vector<uint32_t> ids;
  ids.swap(blocked);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t id = ids[i];
    if (!conns[id].open) continue;
    if (!blocked.empty()) {  // still full: keep the rest in order
      blocked.insert(blocked.end(), ids.begin() + static_cast<long>(i), ids.end());
      return;
    }
    advance_conn(id);
  }
}

void Dispatcher::Impl::send_response(const SlotMeta& m, uint32_t status, const uint8_t* payload, uint32_t len) {
  WireHeader h{status == kSlotOk ? kResponseMagic : kErrorMagic, len, m.tag};
  {
    std::lock_guard<std::mutex> lock(stats_mu);
    stats.responses++;
    if (status != kSlotOk) stats.error_responses++;
  }
  if (m.udp) {
    iovec iov[2] = {{&h, sizeof h}, {const_cast<uint8_t*>(payload), len}};
    msghdr msg{};
    msg.msg_name = const_cast<sockaddr_storage*>(&m.addr.ss);
    msg.msg_namelen = m.addr.len;
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    if (::sendmsg(udp.get(), &msg, MSG_DONTWAIT) < 0) count(&DispatcherStats::responses_discarded);
    return;
  }
  if (m.conn >= conns.size() || !conns[m.conn].open || conns[m.conn].gen != m.gen) {
    count(&DispatcherStats::responses_discarded);
    return;
  }
  Conn& c = conns[m.conn];
  c.out.append(reinterpret_cast<const char*>(&h), sizeof h);
  c.out.append(reinterpret_cast<const char*>(payload), len);
  flush_conn(m.conn);
}

void Dispatcher::Impl::flush_conn(uint32_t id) {
  Conn& c = conns[id];
  while (c.out_off < c.out.size()) {
    ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      drop_conn(id, std::string("send failed: ") + std::strerror(errno));
      return;
    }
    c.out_off += static_cast<size_t>(n);
  }
  if (c.out_off == c.out.size()) {
    c.out.clear();
    c.out_off = 0;
  } else if (c.out_off > (1u << 20)) {
    c.out.erase(0, c.out_off);
    c.out_off = 0;
  }
  bool want = !c.out.empty();
  if (want != c.want_out) {
    watch(c.fd.get(), FdKind::kConn, id, EPOLLIN | EPOLLRDHUP | (want ? EPOLLOUT : 0u), true);
    c.want_out = want;
  }
}

}  // namespace dmx::mqueue
