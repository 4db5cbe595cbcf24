// The data path: registrations, isend / irecv / iflush / test, and closing comms.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <climits>

#include "plugins/nccl/cuda_pointer.h"
#include "plugins/nccl/log.h"
#include "plugins/nccl/state.h"

namespace dmx::nccl {

namespace {

Comm* as_comm(void* comm) {
  auto* c = static_cast<Comm*>(comm);
  return c != nullptr && c->magic == kCommMagic ? c : nullptr;
}

int capacity(const Comm& c, ReqKind k) {
  return k == ReqKind::kSend ? kMaxSendRequests : kMaxRecvRequests;  // iflush: as many as irecv
}

// A free request slot, or nullptr when NCCL has more in flight than it may. Caller holds c.mu.
NetRequest* take(Comm& c, ReqKind k) {
  if (c.outstanding[static_cast<size_t>(k)] >= capacity(c, k) || c.free.empty()) return nullptr;
  NetRequest* r = &c.pool[static_cast<size_t>(c.free.back())];
  c.free.pop_back();
  ++c.outstanding[static_cast<size_t>(k)];
  r->magic = kRequestMagic;
  r->kind = k;
  r->n = 0;
  r->comm = &c;
  return r;
}

void give_back(NetRequest* r) {
  Comm& c = *r->comm;
  std::lock_guard<std::mutex> lock(c.mu);
  r->magic = 0;
  for (int i = 0; i < r->n; ++i) r->ops[static_cast<size_t>(i)] = Request();
  --c.outstanding[static_cast<size_t>(r->kind)];
  c.free.push_back(static_cast<int>(r - c.pool.data()));
}

// The dmx tag of the next message with NCCL tag `tag` on this comm. Caller holds c.mu.
uint64_t wire_tag(Comm& c, int tag) {
  uint32_t s = c.seq[static_cast<uint32_t>(tag)]++;
  return (static_cast<uint64_t>(static_cast<uint32_t>(tag)) << 32) | (s & 0x7fffffffu);
}

OpOptions op_options() {
  OpOptions o;
  auto t = plugin().op_timeout;
  if (t.count() > 0) o.timeout = t;
  return o;
}

NcclResult too_many(Comm& c, const char* what) {
  warn("{} on comm with {}: more than {} requests in flight (NCCL_NET_MAX_REQUESTS{})", what, c.peer,
       c.is_send ? kMaxSendRequests : kMaxRecvRequests, c.is_send ? " x maxRecvs" : "");
  return kInternalError;
}

// The memory of [data, data + size) under registration `mh`, or why not.
NcclResult region_of(void* mh, void* data, size_t size, MemRegion* out, const char* what) {
  auto* m = static_cast<MemHandle*>(mh);
  if (size > kMaxMessage) {
    warn("{}: {} bytes, more than maxP2pBytes ({})", what, size, kMaxMessage);
    return kInternalError;
  }
  if (m == nullptr || m->magic != kMemMagic) {
    warn("{}: no registration for buffer {}", what, data);
    return kInternalError;
  }
  auto p = reinterpret_cast<uintptr_t>(data);
  if (size > 0 && (p < m->base || p - m->base > m->size || size > m->size - (p - m->base))) {
    warn("{}: [{}, +{}) is outside its registration [{:#x}, +{})", what, data, size, m->base, m->size);
    return kInternalError;
  }
  *out = MemRegion{data, size, m->where};
  return kSuccess;
}

NcclResult to_result(const Status& s) {
  switch (s.code()) {
    case Code::kTruncated:
      return kInvalidUsage;  // a receive smaller than the message: NCCL's "sizes mismatch"
    case Code::kPeerFailed:
    case Code::kProtocol:
    case Code::kAuth:
      return kRemoteError;
    case Code::kInvalidArgument:
    case Code::kInternal:
      return kInternalError;
    default:
      return kSystemError;
  }
}

}  // namespace

Comm* make_comm(Endpoint ep, bool is_send, int dev) {
  auto* c = new Comm;
  c->is_send = is_send;
  c->dev = dev;
  c->peer = ep.peer();
  c->ep = std::move(ep);
  int slots = is_send ? kMaxSendRequests : 2 * kMaxRecvRequests;
  c->pool.resize(static_cast<size_t>(slots));
  for (int i = slots - 1; i >= 0; --i) c->free.push_back(i);
  EndpointStats st = c->ep.stats();
  info(kSubsysNet, "{} comm with {} on device {}: {} over {} stream(s)", is_send ? "send" : "recv", c->peer, dev,
       st.transport, st.streams);
  return c;
}

NcclResult reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) {
  if (as_comm(comm) == nullptr || mhandle == nullptr) return kInternalError;
  auto m = std::make_unique<MemHandle>();
  m->base = reinterpret_cast<uintptr_t>(data);
  m->size = size;
  if (type == kPtrHost) {
    m->where = MemSpec{MemKind::kHost, 0};
  } else if (type == kPtrCuda && (plugin().ptr_support & kPtrCuda)) {
    auto dev = cuda_device_of(data);
    if (!dev.ok()) {
      warn("regMr({}, {} B, CUDA): {}", data, size, dev.status().to_string());
      return kInternalError;
    }
    m->where = MemSpec{MemKind::kCuda, *dev};
  } else {
    warn("regMr({}, {} B): pointer type {} is not offered (ptrSupport {:#x})", data, size, type,
         plugin().ptr_support);
    return kInternalError;
  }
  *mhandle = m.release();
  return kSuccess;
}

NcclResult reg_mr_dma_buf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle) {
  NcclResult r = reg_mr(comm, data, size, type, mhandle);
  if (r != kSuccess) return r;
  static_cast<MemHandle*>(*mhandle)->dmabuf = true;
  // NCCL closes the fd after this call; dmx does not keep it.
  if (!plugin().dmabuf_noted.exchange(true))
    info(kSubsysNet, "regMrDmaBuf(fd {}, offset {}): recorded; this memory moves by copy-engine staging over TCP "
         "(devmem TX is not used for NCCL comms: it needs a NIC with header split and flow steering, "
         "and the plugin's comms run on the tcp transport)", fd, offset);
  return kSuccess;
}

NcclResult dereg_mr(void* comm, void* mhandle) {
  auto* m = static_cast<MemHandle*>(mhandle);
  if (as_comm(comm) == nullptr || m == nullptr || m->magic != kMemMagic) return kInternalError;
  m->magic = 0;
  delete m;
  return kSuccess;
}

NcclResult isend(void* send_comm, void* data, size_t size, int tag, void* mhandle, void** request) {
  Comm* c = as_comm(send_comm);
  if (c == nullptr || !c->is_send || request == nullptr) return kInternalError;
  *request = nullptr;
  MemRegion src;
  if (NcclResult r = region_of(mhandle, data, size, &src, "isend"); r != kSuccess) return r;
  std::unique_lock<std::mutex> lock(c->mu);
  NetRequest* req = take(*c, ReqKind::kSend);
  if (req == nullptr) return too_many(*c, "isend");
  uint64_t wt = wire_tag(*c, tag);
  lock.unlock();
  req->ops[0] = c->ep.send(src, wt, op_options());
  req->n = 1;
  *request = req;
  return kSuccess;
}

NcclResult irecv(void* recv_comm, int n, void** data, const size_t* sizes, const int* tags, void** mhandles,
             void** request) {
  Comm* c = as_comm(recv_comm);
  if (c == nullptr || c->is_send || request == nullptr || data == nullptr || sizes == nullptr || tags == nullptr ||
      mhandles == nullptr)
    return kInternalError;
  *request = nullptr;  // also clears NCCL_NET_OPTIONAL_RECV_COMPLETION: dmx always completes receives
  if (n < 1 || n > kMaxRecvs) {
    warn("irecv: {} buffers; maxRecvs is {}", n, kMaxRecvs);
    return kInternalError;
  }
  std::array<MemRegion, kMaxRecvs> dst;
  for (int i = 0; i < n; ++i)
    if (NcclResult r = region_of(mhandles[i], data[i], sizes[i], &dst[static_cast<size_t>(i)], "irecv"); r != kSuccess)
      return r;
  std::unique_lock<std::mutex> lock(c->mu);
  NetRequest* req = take(*c, ReqKind::kRecv);
  if (req == nullptr) return too_many(*c, "irecv");
  std::array<uint64_t, kMaxRecvs> wt;
  for (int i = 0; i < n; ++i) wt[static_cast<size_t>(i)] = wire_tag(*c, tags[i]);
  lock.unlock();
  OpOptions o = op_options();
  for (int i = 0; i < n; ++i) req->ops[static_cast<size_t>(i)] = c->ep.recv(dst[static_cast<size_t>(i)], wt[static_cast<size_t>(i)], o);
  req->n = n;
  *request = req;
  return kSuccess;
}

NcclResult iflush(void* recv_comm, int n, void** data, const int* sizes, void** mhandles, void** request) {
  Comm* c = as_comm(recv_comm);
  if (c == nullptr || c->is_send || request == nullptr) return kInternalError;
  *request = nullptr;
  // A receive into GPU memory completes only after its copy engine copy has finished, so the data
  // is visible to the GPU already: the flush completes at once.
  std::lock_guard<std::mutex> lock(c->mu);
  NetRequest* req = take(*c, ReqKind::kFlush);
  if (req == nullptr) return too_many(*c, "iflush");
  *request = req;
  return kSuccess;
}

NcclResult test(void* request, int* done, int* sizes) {
  auto* r = static_cast<NetRequest*>(request);
  if (r == nullptr || done == nullptr || r->magic != kRequestMagic) return kInternalError;
  for (int i = 0; i < r->n; ++i)
    if (!r->ops[static_cast<size_t>(i)].test()) {
      *done = 0;
      return kSuccess;
    }
  Status first;
  for (int i = 0; i < r->n; ++i) {
    const Request& op = r->ops[static_cast<size_t>(i)];
    Status s = op.status();
    if (!s.ok() && first.ok()) first = s;
    // Sizes were checked at posting (at most kMaxMessage), so they fit an int.
    if (sizes != nullptr) sizes[i] = s.ok() ? static_cast<int>(op.bytes()) : 0;
  }
  Comm* c = r->comm;
  const char* what = r->kind == ReqKind::kSend ? "isend" : "irecv";
  give_back(r);
  *done = 1;
  if (first.ok()) return kSuccess;
  if (!c->error_logged.exchange(true)) warn("{} on comm with {} failed: {}", what, c->peer, first.to_string());
  return to_result(first);
}

NcclResult close_comm(void* comm, bool is_send) {
  Comm* c = as_comm(comm);
  if (c == nullptr || c->is_send != is_send) return kInternalError;
  c->magic = 0;
  // The striping, for NCCL's log: bytes per TCP stream in this comm's direction.
  EndpointStats st = c->ep.stats();
  const auto& per = is_send ? st.stream_bytes_sent : st.stream_bytes_received;
  info(kSubsysNet, "{} comm with {} closed: {} messages, {} B over {} stream(s); per stream: {}",
       is_send ? "send" : "recv", c->peer, is_send ? st.messages_sent : st.messages_received,
       is_send ? st.bytes_sent : st.bytes_received, st.streams, fmt::join(per, " "));
  // Fails what is still in flight and returns once dmx touches none of its buffers.
  Status s = c->ep.close();
  NcclResult r = kSuccess;
  if (!s.ok() && s.code() != Code::kClosed && s.code() != Code::kPeerFailed) {
    warn("closing comm with {}: {}", c->peer, s.to_string());
    r = kSystemError;
  }
  delete c;
  return r;
}

NcclResult close_send(void* send_comm) { return close_comm(send_comm, true); }
NcclResult close_recv(void* recv_comm) { return close_comm(recv_comm, false); }

}  // namespace dmx::nccl
