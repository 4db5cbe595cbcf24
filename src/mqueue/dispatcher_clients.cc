// The client side of the dispatcher: UDP datagrams and TCP connections, checked byte by byte.
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "mqueue/dispatcher_impl.h"
#include "mqueue/request_header.h"

namespace dmx::mqueue {

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
    m.from = SlotMeta::From::kUdp;
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
    Framing framing{true, static_cast<uint64_t>(n), (msg.msg_flags & MSG_TRUNC) != 0};
    CheckedHeader ch = check_request_header(reinterpret_cast<const uint8_t*>(&wh),
                                            std::min(static_cast<size_t>(n), sizeof wh), l.g.max_request, framing);
    if (!ch.ok()) {
      uint64_t bad;
      {
        std::lock_guard<std::mutex> lock(stats_mu);
        bad = ++stats.bad_datagrams;
      }
      log.emit("datagram", "dropped a datagram from udp client " + m.addr.to_string() + ": " + ch.why + " (" +
                               std::to_string(bad) + " so far)");
      continue;
    }
    m.tag = wh.tag;
    if (!post(static_cast<uint32_t>(w), wh.len, m)) return;
  }
}

void Dispatcher::Impl::refuse(int fd, const SockAddr& peer, const std::string& why) {
  refuse_client(fd, peer, why, log);
  count(&DispatcherStats::refused_clients);
}

void Dispatcher::Impl::on_accept() {
  for (;;) {
    SockAddr peer;
    peer.len = sizeof peer.ss;
    int fd = ::accept4(listen.get(), reinterpret_cast<sockaddr*>(&peer.ss), &peer.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      switch (accept_errors.failed(errno)) {
        case AcceptErrors::Next::kRetry: continue;
        case AcceptErrors::Next::kPause:
          // The listen socket stays readable while we cannot accept: take it out of epoll for a
          // while (run() puts it back).
          accept_paused = true;
          accept_paused_until = std::chrono::steady_clock::now() + kAcceptPause;
          watch(listen.get(), FdKind::kListen, 0, 0, true);
          count(&DispatcherStats::accept_pauses);
          return;
        case AcceptErrors::Next::kEmpty:
        case AcceptErrors::Next::kFailed: return;
      }
    }
    accept_errors.accepted();
    const std::string host = host_of(peer);
    if (per_host.count(host) >= cfg.max_per_address) {
      refuse(fd, peer, std::to_string(cfg.max_per_address) + " connections from " + host +
                           " already (max_per_address)");
      continue;
    }
    uint32_t id = 0;
    while (id < conns.size() && conns[id].open) ++id;
    if (id >= cfg.max_connections) {
      refuse(fd, peer, std::to_string(cfg.max_connections) + " connections already (max_connections)");
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
    c.host = host;
    c.last_active = std::chrono::steady_clock::now();
    per_host.add(host);
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
    log.emit("drop", "dropped " + c.name + ": " + why);
  }
  (void)::epoll_ctl(ep.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
  c.fd.reset();
  c.open = false;
  per_host.remove(c.host);
  c.in_flight = 0;
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
      c.in_flight++;
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
    c.last_active = std::chrono::steady_clock::now();
    c.got += static_cast<size_t>(n);
    if (c.state == Conn::State::kHeader && c.got == sizeof c.hdr) {
      CheckedHeader ch = check_request_header(reinterpret_cast<const uint8_t*>(&c.hdr), sizeof c.hdr, l.g.max_request);
      if (!ch.ok()) {
        drop_conn(id, ch.why);
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
  auto ms = [](Duration d) { return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()); };
  sweep_dmx(now);
  for (uint32_t id = 0; id < conns.size(); ++id) {
    Conn& c = conns[id];
    if (!c.open) continue;
    // kReady is waiting for us, not for the client; kHeader with nothing read is idle.
    bool reading = c.state == Conn::State::kPayload || (c.state == Conn::State::kHeader && c.got > 0);
    if (reading && now - c.begun > cfg.request_timeout) {
      drop_conn(id, "stalled mid-request (" + std::to_string(c.got) + " bytes of the " +
                        (c.state == Conn::State::kHeader ? "header" : "payload") + " in " + ms(cfg.request_timeout) +
                        " ms)");
    } else if (!reading && c.state == Conn::State::kHeader && c.in_flight == 0 && c.out.size() == c.out_off &&
               now - c.last_active > cfg.idle_timeout) {
      count(&DispatcherStats::idle_closed);
      log.emit("idle", "closed " + c.name + ": sent nothing for " + ms(cfg.idle_timeout) + " ms (idle_timeout)");
      drop_conn(id, "");
    }
  }
}

void Dispatcher::Impl::retry_blocked() {
  std::vector<uint32_t> ids;
  ids.swap(blocked);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t id = ids[i];
    if (!conns[id].open) continue;
    if (!blocked.empty()) {  // still full: keep the rest in order
      for (size_t k = i; k < ids.size(); ++k) blocked.push_back(ids[k]);  // (insert: a GCC 13 false -Wstringop-overflow)
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
  if (m.from == SlotMeta::From::kDmx) {
    send_dmx(m.conn, h.magic, m.tag, payload, len, true);  // checks that the client is still there
    return;
  }
  if (m.from == SlotMeta::From::kUdp) {
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
  if (c.in_flight > 0) c.in_flight--;
  c.last_active = std::chrono::steady_clock::now();
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
