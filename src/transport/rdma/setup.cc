#include "transport/rdma/setup.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/log.h"

namespace dmx::rdma {
namespace {

constexpr uint8_t kTimeout = 14;      // 4.096 us * 2^14 = 67 ms per transport retry
// Then the queue pair fails: a peer gone is seen in ~0.5 s. Not 7: rxe reads 7 as "retry forever"
// (as the spec does only for rnr_retry), and a read to a queue pair that never answers would hang.
constexpr uint8_t kRetries = 6;
constexpr uint8_t kRnrRetry = 7;      // infinite: a busy peer that has not reposted its receives yet
constexpr uint8_t kMinRnrTimer = 12;  // 0.64 ms

Status io_wait(int fd, short events, Deadline deadline, const std::string& peer, const char* what) {
  pollfd p{fd, events, 0};
  for (;;) {
    int r = ::poll(&p, 1, deadline.poll_timeout_ms());
    if (r > 0) return Status();
    if (r == 0)
      return Status(Code::kTimeout, fmt::format("rdma: timed out {} the queue-pair info", what)).with_peer(peer);
    if (errno != EINTR) return errno_status("poll(rdma data socket)", errno).with_peer(peer);
  }
}

Status write_all(int fd, const unsigned char* p, size_t n, Deadline d, const std::string& peer) {
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w, n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      DMX_RETURN_IF_ERROR(io_wait(fd, POLLOUT, d, peer, "sending"));
      continue;
    }
    return errno_status("send(rdma queue-pair info)", errno).with_peer(peer);
  }
  return Status();
}

Status read_all(int fd, unsigned char* p, size_t n, Deadline d, const std::string& peer) {
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r, n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0)
      return Status(Code::kClosed, "rdma: the peer closed the data socket during the queue-pair exchange").with_peer(peer);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      DMX_RETURN_IF_ERROR(io_wait(fd, POLLIN, d, peer, "receiving"));
      continue;
    }
    return errno_status("recv(rdma queue-pair info)", errno).with_peer(peer);
  }
  return Status();
}

Status verbs_error(const std::string& call, int err, const std::string& peer) {
  return Status(Code::kUnavailable, fmt::format("rdma: {} failed: {}", call, errno_text(err))).with_peer(peer);
}

}  // namespace

Status Connection::post_slot(int qp, uint32_t i, const std::string& peer) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(recv_slot(qp, i)), static_cast<uint32_t>(kSmallMax), slots_mr->lkey()};
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  wr.wr_id = static_cast<uint64_t>(qp) << 32 | i;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  if (int err = ibv_post_recv(qps[static_cast<size_t>(qp)], &wr, &bad); err) return verbs_error("ibv_post_recv", err, peer);
  return Status();
}

namespace {

uint32_t random_psn() { return static_cast<uint32_t>(random_u64()) & kMaxPsn; }

}  // namespace

Connection::~Connection() {
  destroy_qps();
  if (cq) ibv_destroy_cq(cq);
  if (channel) ibv_destroy_comp_channel(channel);
}

void Connection::to_error() {
  for (ibv_qp* q : qps) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    ibv_modify_qp(q, &a, IBV_QP_STATE);
  }
}

void Connection::destroy_qps() {
  for (ibv_qp* q : qps) ibv_destroy_qp(q);
  qps.clear();
}

int Connection::index_of(uint32_t qpn) const {
  for (size_t i = 0; i < qps.size(); ++i)
    if (qps[i]->qp_num == qpn) return static_cast<int>(i);
  return -1;
}

Result<std::unique_ptr<Connection>> connect_qps(const std::shared_ptr<Device>& device, int sock, Depths depths, const std::string& peer,
                                                Deadline deadline, void (*hostile)(ConnInfo*)) {
  const Device& dev = *device;
  const PortChoice& pc = dev.choice();
  auto c = std::make_unique<Connection>();
  depths.qps = std::clamp(depths.qps, 1, kMaxQps);
  c->depths = depths;
  ibv_device_attr da{};
  if (int err = ibv_query_device(dev.context(), &da); err != 0) return verbs_error("ibv_query_device", err, peer);
  ibv_pd* pd = ibv_alloc_pd(dev.context());
  if (!pd) return verbs_error("ibv_alloc_pd", errno, peer);
  c->pd = std::make_shared<Pd>(pd, device);
  c->channel = ibv_create_comp_channel(dev.context());
  if (!c->channel) return verbs_error("ibv_create_comp_channel", errno, peer);
  if (int fl = ::fcntl(c->channel->fd, F_GETFL); fl < 0 || ::fcntl(c->channel->fd, F_SETFL, fl | O_NONBLOCK) < 0)
    return verbs_error("fcntl(completion channel, O_NONBLOCK)", errno, peer);
  c->cq_depth = std::min(depths.qps * (depths.send + depths.recv), da.max_cqe);
  c->cq = ibv_create_cq(dev.context(), c->cq_depth, nullptr, c->channel, 0);
  if (!c->cq) return verbs_error(fmt::format("ibv_create_cq({} entries)", c->cq_depth), errno, peer);
  // The slot pool: receive slots of every queue pair, then the send slots.
  c->qps_made = static_cast<size_t>(depths.qps);
  c->send_sge = std::clamp(da.max_sge, 1, kMaxSendSge);
  c->send_slots = static_cast<uint32_t>(depths.qps) * 16;
  const size_t pool = (c->qps_made * static_cast<size_t>(depths.recv) + c->send_slots) * kSmallMax;
  c->slots.reset(new (std::nothrow) unsigned char[pool]);
  if (!c->slots) return Status(Code::kResourceExhausted, fmt::format("rdma: no memory for {} B of slots", pool)).with_peer(peer);
  ibv_mr* smr = ibv_reg_mr(pd, c->slots.get(), pool, IBV_ACCESS_LOCAL_WRITE);
  if (!smr) return verbs_error(fmt::format("ibv_reg_mr(slots, {} B)", pool), errno, peer);
  c->slots_mr = std::make_shared<Mr>(c->pd, smr, "ibv_reg_mr");
  for (int i = 0; i < depths.qps; ++i) {
    ibv_qp_init_attr ia{};
    ia.send_cq = c->cq;
    ia.recv_cq = c->cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = static_cast<uint32_t>(depths.send);
    ia.cap.max_recv_wr = static_cast<uint32_t>(depths.recv);
    ia.cap.max_send_sge = static_cast<uint32_t>(c->send_sge);
    ia.cap.max_recv_sge = 1;
    ia.sq_sig_all = 1;
    ibv_qp* q = ibv_create_qp(c->pd->get(), &ia);
    if (!q) return verbs_error(fmt::format("ibv_create_qp(RC, {} send / {} receive)", depths.send, depths.recv), errno, peer);
    c->qps.push_back(q);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = pc.port;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;  // into a receiver's clear-to-send window only
    if (int err = ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS); err)
      return verbs_error("ibv_modify_qp(INIT)", err, peer);
    for (int k = 0; k < depths.recv; ++k) DMX_RETURN_IF_ERROR(c->post_slot(i, static_cast<uint32_t>(k), peer));
  }
  c->mine.credits = static_cast<uint8_t>(std::clamp(depths.recv / 2, 1, kMaxCredits));
  c->mine.mtu = pc.mtu;
  c->mine.lid = pc.lid;
  c->mine.gid = pc.gid;
  c->mine.max_chunk = std::clamp(depths.max_chunk, kMinChunk, kMaxChunk);
  for (ibv_qp* q : c->qps) c->mine.qps.push_back({q->qp_num, random_psn()});
  ConnInfo sent = c->mine;
  if (hostile) hostile(&sent);
  std::vector<unsigned char> out = sent.encode();
  DMX_RETURN_IF_ERROR(write_all(sock, out.data(), out.size(), deadline, peer));
  std::vector<unsigned char> in(ConnInfo::kFixed);
  DMX_RETURN_IF_ERROR(read_all(sock, in.data(), in.size(), deadline, peer));
  auto total = ConnInfo::total_size(in);
  if (!total.ok()) return total.status().with_peer(peer);
  in.resize(*total);
  DMX_RETURN_IF_ERROR(read_all(sock, in.data() + ConnInfo::kFixed, *total - ConnInfo::kFixed, deadline, peer));
  DMX_ASSIGN_OR_RETURN(c->theirs, ConnInfo::decode(in, peer));
  // The peer's queue pairs are never ours: a QPN of this path (or one named twice) is a peer trying
  // to wire our queue pairs to each other.
  for (const ConnInfo::Qp& q : c->theirs.qps)
    if (c->theirs.gid == c->mine.gid && c->index_of(q.qpn) >= 0)
      return Status(Code::kProtocol, fmt::format("rdma: the peer names queue pair {:#x}, which is this side's own", q.qpn))
          .with_peer(peer);
  size_t n = std::min(c->mine.qps.size(), c->theirs.qps.size());
  while (c->qps.size() > n) {
    ibv_destroy_qp(c->qps.back());
    c->qps.pop_back();
  }
  c->max_rd_atomic = std::clamp(std::min(da.max_qp_rd_atom, da.max_qp_init_rd_atom), 1, 16);
  for (size_t i = 0; i < n; ++i) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = static_cast<ibv_mtu>(std::min(c->mine.mtu, c->theirs.mtu));
    a.dest_qp_num = c->theirs.qps[i].qpn;
    a.rq_psn = c->theirs.qps[i].psn;
    a.max_dest_rd_atomic = static_cast<uint8_t>(c->max_rd_atomic);
    a.min_rnr_timer = kMinRnrTimer;
    a.ah_attr.port_num = pc.port;
    a.ah_attr.dlid = c->theirs.lid;
    if (pc.ethernet || c->theirs.gid != Gid{}) {
      a.ah_attr.is_global = pc.ethernet ? 1 : 0;
      std::memcpy(a.ah_attr.grh.dgid.raw, c->theirs.gid.data(), 16);
      a.ah_attr.grh.sgid_index = static_cast<uint8_t>(pc.gid_index);
      a.ah_attr.grh.hop_limit = 64;
    }
    if (int err = ibv_modify_qp(c->qps[i], &a,
                                IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
        err)
      return verbs_error(fmt::format("ibv_modify_qp(RTR, to queue pair {:#x})", a.dest_qp_num), err, peer);
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RTS;
    r.timeout = kTimeout;
    r.retry_cnt = kRetries;
    r.rnr_retry = kRnrRetry;
    r.sq_psn = c->mine.qps[i].psn;
    r.max_rd_atomic = static_cast<uint8_t>(c->max_rd_atomic);
    if (int err = ibv_modify_qp(c->qps[i], &r,
                                IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                    IBV_QP_MAX_QP_RD_ATOMIC);
        err)
      return verbs_error("ibv_modify_qp(RTS)", err, peer);
  }
  // Neither side posts before the other's queue pairs are in RTR (their receives were posted in INIT).
  unsigned char ready = 'R';
  DMX_RETURN_IF_ERROR(write_all(sock, &ready, 1, deadline, peer));
  DMX_RETURN_IF_ERROR(read_all(sock, &ready, 1, deadline, peer));
  if (ready != 'R')
    return Status(Code::kProtocol, fmt::format("rdma: the peer's ready byte is {:#x}", ready)).with_peer(peer);
  return c;
}

}  // namespace dmx::rdma
