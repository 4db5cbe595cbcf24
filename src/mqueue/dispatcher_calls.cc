// The client queues: the workers' calls out to an external service. One TCP connection per
// worker, requests and replies in order (WireHeader framing, tag = the call's sequence number).
#include <sys/epoll.h>

#include <cerrno>
#include <cstring>

#include "mqueue/dispatcher_impl.h"

namespace dmx::mqueue {

Status Dispatcher::Impl::connect_services() {
  const Layout& l = q->layout();
  if (l.g.call_slots == 0 || cfg.service.empty()) return Status();
  DMX_ASSIGN_OR_RETURN(SockAddr a, resolve(cfg.service));
  for (uint32_t w = 0; w < workers.size(); ++w) {
    WorkerState& ws = workers[w];
    ws.svc_name = "service " + a.to_string() + " (worker " + std::to_string(w) + ")";
    Result<Fd> fd = tcp_connect(a, cfg.connect_timeout);
    if (!fd.ok()) return fd.status().with_peer(a.to_string());
    ws.svc = std::move(*fd);
    DMX_RETURN_IF_ERROR(set_nonblocking(ws.svc.get()));
    ws.svc_in.resize(l.g.max_call);
    watch(ws.svc.get(), FdKind::kService, w, EPOLLIN | EPOLLRDHUP);
  }
  return Status();
}

void Dispatcher::Impl::reply_call(uint32_t w, uint32_t status, const uint8_t* data, uint32_t len) {
  const Layout& l = q->layout();
  WorkerState& ws = workers[w];
  const uint32_t seq = ws.replied, s = seq & (l.g.call_slots - 1);
  const uint64_t off = l.crx_slot(w, s);
  uint8_t* slot = q->staging_for(off);
  SlotHeader h{len, status};
  std::memcpy(slot, &h, sizeof h);
  if (len) std::memcpy(slot + sizeof h, data, len);
  Status st = q->publish_staged(off, sizeof h + len);
  if (st.ok()) st = q->store_worker_word(l.crx_flag(w, s), seq + 1);
  if (!st.ok()) {
    failure = st;
    event("writing a call reply into worker memory failed: " + st.to_string());
    return;
  }
  ws.replied++;
  if (status != kSlotOk) count(&DispatcherStats::call_failures);
}

void Dispatcher::Impl::fail_service(uint32_t w, const std::string& why) {
  WorkerState& ws = workers[w];
  if (ws.svc.valid()) {
    event(ws.svc_name + " failed: " + why + "; its calls fail from now on");
    (void)::epoll_ctl(ep.get(), EPOLL_CTL_DEL, ws.svc.get(), nullptr);
    ws.svc.reset();
  }
  while (ws.replied != ws.calls_taken && failure.ok()) reply_call(w, kSlotCallFailed, nullptr, 0);
}

bool Dispatcher::Impl::forward_calls() {
  const Layout& l = q->layout();
  if (l.g.call_slots == 0) return false;
  const uint8_t* rmem = q->response_base();
  const uint32_t credit_every = std::max(1u, l.g.call_slots / 2);
  bool any = false;
  for (uint32_t w = 0; w < workers.size() && failure.ok(); ++w) {
    WorkerState& ws = workers[w];
    for (;;) {
      const uint32_t seq = ws.calls_taken, s = seq & (l.g.call_slots - 1);
      if (q->load_response_word(l.ctx_flag(w, s)) != seq + 1) break;
      SlotHeader h;
      std::memcpy(&h, rmem + l.ctx_slot(w, s), sizeof h);
      ws.calls_taken++;
      any = true;
      count(&DispatcherStats::calls);
      if (!ws.svc.valid() || h.len > l.g.max_call) {
        reply_call(w, kSlotCallFailed, nullptr, 0);
      } else {
        WireHeader wh{kRequestMagic, h.len, seq};
        ws.svc_out.append(reinterpret_cast<const char*>(&wh), sizeof wh);
        ws.svc_out.append(reinterpret_cast<const char*>(rmem + l.ctx_slot(w, s) + sizeof h), h.len);
      }
      if (ws.calls_taken - ws.calls_credited >= credit_every) {
        Status st = q->store_worker_word(l.ctl_of(w) + offsetof(WorkerCtl, call_credit), ws.calls_taken);
        if (!st.ok()) {
          failure = st;
          return false;
        }
        ws.calls_credited = ws.calls_taken;
        count(&DispatcherStats::credit_writes);
      }
    }
    // Calls are small and few per worker: send them now (the socket buffer takes them).
    while (ws.svc.valid() && ws.svc_out_off < ws.svc_out.size()) {
      ssize_t n = ::send(ws.svc.get(), ws.svc_out.data() + ws.svc_out_off, ws.svc_out.size() - ws.svc_out_off,
                         MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        fail_service(w, std::string("send failed: ") + std::strerror(errno));
        break;
      }
      ws.svc_out_off += static_cast<size_t>(n);
    }
    if (ws.svc_out_off == ws.svc_out.size()) {
      ws.svc_out.clear();
      ws.svc_out_off = 0;
    }
  }
  return any;
}

void Dispatcher::Impl::on_service(uint32_t w, uint32_t events) {
  const Layout& l = q->layout();
  WorkerState& ws = workers[w];
  for (int i = 0; i < 64 && ws.svc.valid() && failure.ok(); ++i) {
    const bool in_header = ws.svc_got < sizeof ws.svc_hdr;
    uint8_t* dst = in_header ? reinterpret_cast<uint8_t*>(&ws.svc_hdr) + ws.svc_got
                             : ws.svc_in.data() + (ws.svc_got - sizeof ws.svc_hdr);
    size_t want = in_header ? sizeof ws.svc_hdr - ws.svc_got : sizeof ws.svc_hdr + ws.svc_hdr.len - ws.svc_got;
    ssize_t n = want ? ::recv(ws.svc.get(), dst, want, MSG_DONTWAIT) : 0;
    if (want && n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      return fail_service(w, std::string("recv failed: ") + std::strerror(errno));
    }
    if (want && n == 0) return fail_service(w, "closed the connection");
    ws.svc_got += static_cast<size_t>(n);
    if (ws.svc_got == sizeof ws.svc_hdr) {  // a whole header: check it before reading on
      if (ws.svc_hdr.magic != kResponseMagic) return fail_service(w, "a reply with a bad magic");
      if (ws.svc_hdr.len > l.g.max_call)
        return fail_service(w, "a reply of " + std::to_string(ws.svc_hdr.len) + " B over max_call");
      if (ws.svc_hdr.tag != ws.replied || ws.replied == ws.calls_taken)
        return fail_service(w, "a reply to call " + std::to_string(ws.svc_hdr.tag) + " not asked");
    }
    if (ws.svc_got >= sizeof ws.svc_hdr && ws.svc_got == sizeof ws.svc_hdr + ws.svc_hdr.len) {
      reply_call(w, kSlotOk, ws.svc_in.data(), ws.svc_hdr.len);
      ws.svc_got = 0;
    }
  }
}

}  // namespace dmx::mqueue
