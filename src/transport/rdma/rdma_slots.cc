// The rdma path's SEND slots (rdma_path_impl.h): small chunks by SEND with their credits,
// clear-to-sends and `done`s going out, and the per-queue-pair send queues every post goes through.
#include <fmt/format.h>

#include <cstring>

#include "transport/rdma/rdma_path_impl.h"

namespace dmx::rdma::path_impl {

// The receiver: a small chunk's header; its bytes may be in a slot already.
void RdmaPath::start_small_rx(const RxJob& j, std::vector<Done>* done) {
  if (auto h = held_.find(j.d.token); h != held_.end()) {
    Held held = h->second;
    held_.erase(h);
    land_small(j, held, done);
  } else if (!small_rx_.emplace(j.d.token, j).second) {
    fail_with(Status(Code::kProtocol, fmt::format("rdma: the peer sent small chunk token {} twice", j.d.token))
                  .with_peer(peer_));
  }
}

// A SEND of the peer's in receive slot `slot` of queue pair `qp` (wire.h's QpMessage).
void RdmaPath::on_message(int qp, uint32_t slot, uint32_t byte_len, uint32_t word, std::vector<Done>* done) {
  const uint32_t token = word & kMaxToken;
  switch (word >> 24) {
    case kMsgCts: {
      std::span<const unsigned char> body(conn_->recv_slot(qp, slot), std::min<size_t>(byte_len, kSmallMax));
      std::vector<unsigned char> copy(body.begin(), body.end());
      repost(qp, slot);
      return on_cts(token, copy, done);
    }
    case kMsgSmall: {
      if (held_per_qp_[static_cast<size_t>(qp)] >= conn_->mine.credits)
        return protocol(fmt::format("the peer sent more small chunks on queue pair {} than its {} credits (a flood)",
                                    qp, conn_->mine.credits));
      ++held_per_qp_[static_cast<size_t>(qp)];
      Held h{qp, slot, byte_len};
      if (auto it = small_rx_.find(token); it != small_rx_.end()) {
        RxJob j = it->second;
        small_rx_.erase(it);
        return land_small(j, h, done);
      }
      if (!held_.emplace(token, h).second) return protocol(fmt::format("small chunk token {} came twice", token));
      return;
    }
    case kMsgDone: {
      repost(qp, slot);
      auto it = small_inflight_.find(token);
      if (it == small_inflight_.end())
        return protocol(fmt::format("the peer released small chunk token {}, which is not in flight", token));
      ++credits_[static_cast<size_t>(it->second)];
      small_inflight_.erase(it);
      return;
    }
    default:
      return protocol(fmt::format("message kind {} (immediate {:#x})", word >> 24, word));
  }
}

// A small chunk's bytes met its header: into the destination, the slot back to the NIC, and the
// credit back to the sender.
void RdmaPath::land_small(const RxJob& j, const Held& h, std::vector<Done>* done) {
  Status s;
  if (h.len != j.d.len) {
    s = Status(Code::kProtocol,
               fmt::format("rdma: small chunk token {} is {} B, its header said {} B", j.d.token, h.len, j.d.len))
            .with_peer(peer_);
  } else if (j.dst.ptr != nullptr && h.len > 0) {
    const unsigned char* from = conn_->recv_slot(h.qp, h.slot);
    if (host_kind(j.dst.where)) {
      std::memcpy(j.dst.ptr, from, h.len);
      PathCounters::add(counters_.host_copies);
    } else {
      s = copy_memory(j.dst, MemRegion{const_cast<unsigned char*>(from), h.len, MemSpec{}});
      PathCounters::add(counters_.device_copies);
    }
  }
  --held_per_qp_[static_cast<size_t>(h.qp)];
  repost(h.qp, h.slot);
  queue_wr(h.qp, send_wr(send_id(kWrSend, kNoSlot, j.d.token), ibv_sge{}, imm(kMsgDone, j.d.token)));
  PathCounters::add(counters_.chunks_received);
  PathCounters::add(counters_.bytes_received, h.len);
  done->push_back({false, j.seq, s});
  if (!s.ok()) fail_with(s);
}

// Small chunks waiting for a credit and a send slot, in order.
bool RdmaPath::send_small(std::vector<Done>* done) {
  bool any = false;
  while (!small_waiting_.empty() && !free_slots_.empty() && !failed()) {
    const size_t nqp = conn_->qps.size();
    int qp = -1;
    for (size_t k = 0; k < nqp; ++k) {
      size_t q = (next_small_qp_ + k) % nqp;
      if (credits_[q] > 0 || (tamper_ && tamper_->ignore_credits)) {
        qp = static_cast<int>(q);
        break;
      }
    }
    if (qp < 0) break;  // the peer has all our credits: backpressure until its kMsgDone
    next_small_qp_ = (static_cast<size_t>(qp) + 1) % nqp;
    uint32_t token = small_waiting_.front();
    small_waiting_.pop_front();
    uint64_t seq = 0;
    uint64_t len = 0;
    uint32_t slot = free_slots_.front();
    {
      std::lock_guard lock(tx_mu_);
      auto it = tx_.find(token);
      if (it == tx_.end()) continue;  // completed by the end already
      seq = it->second.seq;
      len = it->second.src.size;
      if (len > 0) std::memcpy(conn_->send_slot(slot), it->second.src.ptr, len);
      tx_.erase(it);
    }
    free_slots_.pop_front();
    --credits_[static_cast<size_t>(qp)];
    small_inflight_[token] = qp;
    queue_wr(qp, send_wr(send_id(kWrSend, slot, token),
                         ibv_sge{reinterpret_cast<uintptr_t>(conn_->send_slot(slot)), static_cast<uint32_t>(len),
                                 conn_->slots_mr->lkey()},
                         imm(kMsgSmall, token)));
    done->push_back({true, seq, Status()});  // copied: the source is free
    any = true;
  }
  return any;
}

// The receiver's clear-to-send (or drop) for `token`, in a send slot.
void RdmaPath::cts(uint32_t token, const Cts& c) {
  if (free_slots_.empty()) {  // every slot is on the wire: wait for one (bounded by the send queues)
    cts_waiting_.push_back({token, c});
    return;
  }
  uint32_t slot = free_slots_.front();
  free_slots_.pop_front();
  std::vector<unsigned char> b = c.encode();
  std::memcpy(conn_->send_slot(slot), b.data(), b.size());
  queue_wr(static_cast<int>(token % conn_->qps.size()),
           send_wr(send_id(kWrSend, slot, token),
                   ibv_sge{reinterpret_cast<uintptr_t>(conn_->send_slot(slot)), static_cast<uint32_t>(b.size()),
                           conn_->slots_mr->lkey()},
                   imm(kMsgCts, token)));
}

void RdmaPath::queue_wr(int qp, const Wr& w) {
  sq_waiting_[static_cast<size_t>(qp)].push_back(w);
  flush_qp(qp);
}

bool RdmaPath::flush_waiting() {
  bool any = false;
  while (!cts_waiting_.empty() && !free_slots_.empty()) {
    auto [token, c] = cts_waiting_.front();
    cts_waiting_.pop_front();
    cts(token, c);
    any = true;
  }
  for (size_t q = 0; q < sq_waiting_.size(); ++q) any = flush_qp(static_cast<int>(q)) || any;
  return any;
}

bool RdmaPath::flush_qp(int qp) {
  auto& waiting = sq_waiting_[static_cast<size_t>(qp)];
  int& inflight = sq_inflight_[static_cast<size_t>(qp)];
  ibv_qp* q = conn_->qps[static_cast<size_t>(qp)];
  bool any = false;
  // Chained: one ibv_post_send (one doorbell) for up to kPostBatch work requests.
  ibv_send_wr wrs[kPostBatch];
  while (!waiting.empty() && inflight < conn_->depths.send && !failed()) {
    int n = 0;
    for (auto it = waiting.begin(); it != waiting.end() && n < kPostBatch && inflight + n < conn_->depths.send;
         ++it, ++n) {
      Wr& w = *it;
      ibv_send_wr& wr = wrs[n];
      wr = ibv_send_wr{};
      wr.wr_id = w.id;
      wr.opcode = w.opcode;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.imm_data = w.imm;
      wr.sg_list = w.nsge > 0 ? w.sge.data() : nullptr;
      wr.num_sge = w.nsge;
      if (w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM || w.opcode == IBV_WR_RDMA_WRITE) {
        wr.wr.rdma.remote_addr = w.remote_addr;
        wr.wr.rdma.rkey = w.rkey;
      }
      if (n > 0) wrs[n - 1].next = &wr;
    }
    ibv_send_wr* bad = nullptr;
    const int err = ibv_post_send(q, wrs, &bad);
    const int posted = err == 0 ? n : (bad != nullptr ? static_cast<int>(bad - wrs) : 0);
    inflight += posted;
    waiting.erase(waiting.begin(), waiting.begin() + posted);
    any = any || posted > 0;
    if (err) {
      fail_with(Status(Code::kIo,
                       fmt::format("rdma: ibv_post_send on queue pair {:#x} failed: {}", q->qp_num, errno_text(err)))
                    .with_peer(peer_));
      return true;
    }
  }
  return any;
}

void RdmaPath::repost(int qp, uint32_t slot) {
  Status s = conn_->post_slot(qp, slot, peer_);
  if (!s.ok()) fail_with(s);
}

}  // namespace dmx::rdma::path_impl
