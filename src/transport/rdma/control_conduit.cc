#include "transport/rdma/control_conduit.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "core/log.h"

namespace dmx::rdma {
namespace {

using namespace std::chrono_literals;

constexpr int kPollBatch = 32;
constexpr auto kLinger = std::chrono::seconds(2);  // the destructor's wait for its SENDs to be acknowledged
constexpr uint32_t kNoSlot = 0xFFFF;

// wr_id of a send: its kind in the top byte, its send slot (kNoSlot: none) in bits 32-47, its bytes below.
uint64_t send_id(QpMessage k, uint32_t slot, uint32_t bytes) {
  return uint64_t{k} << 56 | uint64_t{slot} << 32 | bytes;
}

class ControlConduit final : public stream::Conduit {
  struct Received {
    uint32_t slot;
    uint32_t len;
    uint32_t off = 0;
  };

 public:
  ControlConduit(std::unique_ptr<Connection> conn, UniqueFd socket, std::string peer)
      : conn_(std::move(conn)), socket_(std::move(socket)), peer_(std::move(peer)), credits_(conn_->theirs.credits) {
    for (uint32_t i = 0; i < conn_->send_slots; ++i) free_slots_.push_back(i);
  }

  ~ControlConduit() override {
    shutdown();
    // What we sent should reach the peer before the queue pair goes (a TCP socket's close keeps
    // its unsent bytes too): bounded, a dead peer does not hold us.
    Deadline d = Deadline::after(kLinger);
    while ((sq_inflight_ > 0 || end_inflight_.load()) && error_.ok() && !d.expired()) {
      if (!poll_cq().ok()) break;
      std::this_thread::sleep_for(100us);
    }
    conn_->to_error();
  }

  Result<size_t> write(std::span<const iovec> buffers) override {
    DMX_RETURN_IF_ERROR(poll_cq());
    if (!error_.ok()) return error_;
    if (ended_.load()) return Status(Code::kClosed, "rdma: the control stream was shut down").with_peer(peer_);
    size_t bi = 0, off = 0, total = 0;
    auto skip_empty = [&] {
      while (bi < buffers.size() && off == buffers[bi].iov_len) ++bi, off = 0;
    };
    skip_empty();
    while (bi < buffers.size() && credits_ > 0 && !free_slots_.empty() && sq_room()) {
      const uint32_t slot = free_slots_.front();
      unsigned char* p = conn_->send_slot(slot);
      uint32_t n = 0;
      while (n < kSmallMax && bi < buffers.size()) {
        size_t k = std::min<size_t>(kSmallMax - n, buffers[bi].iov_len - off);
        std::memcpy(p + n, static_cast<const unsigned char*>(buffers[bi].iov_base) + off, k);
        n += static_cast<uint32_t>(k), off += k;
        skip_empty();
      }
      const uint32_t back = owed_;
      if (!post(send_id(kMsgData, slot, n), ibv_sge{reinterpret_cast<uintptr_t>(p), n, conn_->slots_mr->lkey()},
                kMsgData, back))
        return error_;
      free_slots_.pop_front();
      owed_ = 0;
      --credits_;
      total += n;
    }
    return total;
  }

  Result<size_t> read(void* dst, size_t n) override {
    DMX_RETURN_IF_ERROR(poll_cq());
    size_t got = 0;
    auto* out = static_cast<unsigned char*>(dst);
    while (got < n && !rx_.empty()) {
      Received& r = rx_.front();
      size_t k = std::min<size_t>(n - got, r.len - r.off);
      std::memcpy(out + got, conn_->recv_slot(0, r.slot) + r.off, k);
      got += k;
      r.off += static_cast<uint32_t>(k);
      if (r.off < r.len) break;
      const uint32_t slot = r.slot;
      rx_.pop_front();
      if (error_.ok() && !repost(slot)) break;
      ++owed_;
    }
    give_back_credits();
    if (got > 0) return got;
    if (!error_.ok()) return error_;  // after every byte that came before it
    if (peer_ended_) return Status(Code::kPeerFailed, "rdma: the peer ended the control stream").with_peer(peer_);
    if (socket_closed_)
      return Status(Code::kPeerFailed, "rdma: the peer's data socket closed (the peer died or ended the endpoint)")
          .with_peer(peer_);
    return size_t{0};
  }

  int prepare_sleep(bool want_room, pollfd* fds) override {
    if (!rx_.empty() || !error_.ok() || peer_ended_ || socket_closed_) return -1;
    if (want_room && credits_ > 0 && !free_slots_.empty() && sq_room()) return -1;
    if (ibv_req_notify_cq(conn_->cq, 0) != 0) {
      fail(Status(Code::kIo, "rdma: ibv_req_notify_cq failed"));
      return -1;
    }
    // What completed before the CQ was armed raises no event: look once more.
    ibv_wc batch[kPollBatch];
    int k = ibv_poll_cq(conn_->cq, kPollBatch, batch);
    if (k != 0) {
      if (k > 0) stash_.insert(stash_.end(), batch, batch + k);
      return -1;
    }
    fds[0] = {conn_->channel->fd, POLLIN, 0};
    fds[1] = {socket_.get(), POLLIN, 0};
    return 2;
  }

  void after_sleep() override {
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    while (ibv_get_cq_event(conn_->channel, &cq, &ctx) == 0) ibv_ack_cq_events(cq, 1);
    if (socket_closed_) return;
    char c;
    ssize_t r = ::recv(socket_.get(), &c, 1, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      socket_closed_ = true;
      (void)poll_cq();  // what the peer sent before it went comes first
    } else if (r > 0) {
      fail(Status(Code::kProtocol, "rdma: the peer wrote on the control stream's data socket after the set-up"));
    }
  }

  // Any thread: the end mark goes behind every SEND posted so far (one send-queue entry is kept
  // for it; ibv_post_send is thread-safe).
  void shutdown() override {
    if (ended_.exchange(true)) return;
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = send_id(kMsgEnd, kNoSlot, 0);
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(kMsgEnd << 24);
    end_inflight_.store(!conn_->qps.empty() && ibv_post_send(conn_->qps[0], &wr, &bad) == 0);
  }

  const char* kind() const override { return "rdma"; }
  uint64_t acked_bytes() const override { return acked_.load(std::memory_order_relaxed); }

 private:
  bool sq_room() const { return sq_inflight_ < conn_->depths.send - 1; }  // one entry for the end mark

  bool post(uint64_t id, ibv_sge sge, QpMessage k, uint32_t value) {
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = id;
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(k << 24 | value);
    if (sge.length > 0) {
      wr.sg_list = &sge;
      wr.num_sge = 1;
    }
    if (int err = ibv_post_send(conn_->qps[0], &wr, &bad); err) {
      fail(Status(Code::kIo, fmt::format("rdma: ibv_post_send on the control queue pair failed: {}", errno_text(err))));
      return false;
    }
    ++sq_inflight_;
    return true;
  }

  bool repost(uint32_t slot) {
    Status s = conn_->post_slot(0, slot, peer_);
    if (!s.ok()) fail(s);
    return s.ok();
  }

  // Credits owed go back in a SEND of their own once half the peer's are here (a peer that sends
  // and hears nothing back must not stall); otherwise they ride on our next data SEND.
  void give_back_credits() {
    if (owed_ == 0 || owed_ < static_cast<uint32_t>(std::max(1, conn_->mine.credits / 2)) || !error_.ok() || !sq_room())
      return;
    if (post(send_id(kMsgCredit, kNoSlot, 0), ibv_sge{}, kMsgCredit, owed_)) owed_ = 0;
  }

  void fail(Status s) {
    if (!error_.ok()) return;
    error_ = s.with_peer(peer_);
    if (!ended_.load()) DMX_LOG_WARN("{}", error_.to_string());
  }
  Status protocol(std::string what) {
    fail(Status(Code::kProtocol, "rdma: control stream: " + what));
    return Status();
  }

  Status poll_cq() {
    std::vector<ibv_wc> wcs;
    wcs.swap(stash_);
    for (;;) {
      ibv_wc batch[kPollBatch];
      int k = ibv_poll_cq(conn_->cq, kPollBatch, batch);
      if (k < 0) {
        fail(Status(Code::kIo, "rdma: ibv_poll_cq failed"));
        break;
      }
      wcs.insert(wcs.end(), batch, batch + k);
      if (k < kPollBatch) break;
    }
    for (const ibv_wc& wc : wcs) on_completion(wc);
    return Status();  // errors wait in error_ behind the bytes already received
  }

  void on_completion(const ibv_wc& wc) {
    const auto k = static_cast<uint32_t>(wc.wr_id >> 56);
    if (k == kMsgEnd) {
      end_inflight_.store(false);
      return;
    }
    if (k != 0) {  // ours: a send
      if (sq_inflight_ > 0) --sq_inflight_;
      const uint32_t slot = static_cast<uint32_t>(wc.wr_id >> 32) & 0xFFFF;
      if (slot != kNoSlot) free_slots_.push_back(slot);
      if (wc.status == IBV_WC_SUCCESS) acked_.fetch_add(static_cast<uint32_t>(wc.wr_id), std::memory_order_relaxed);
    }
    if (wc.status != IBV_WC_SUCCESS) {
      if (wc.status == IBV_WC_WR_FLUSH_ERR && !error_.ok()) return;
      fail(Status(wc.status == IBV_WC_RETRY_EXC_ERR ? Code::kPeerFailed : Code::kIo,
                  fmt::format("rdma: {} on the control queue pair {:#x} failed: {} (vendor error {:#x}){}",
                              k != 0 ? "SEND" : "receive", wc.qp_num, ibv_wc_status_str(wc.status), wc.vendor_err,
                              wc.status == IBV_WC_RETRY_EXC_ERR ? ": the peer does not answer (died?)" : "")));
      return;
    }
    if (k != 0 || !error_.ok()) return;
    const auto slot = static_cast<uint32_t>(wc.wr_id);
    if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) return (void)protocol("the peer wrote into the control queue pair");
    if (!(wc.wc_flags & IBV_WC_WITH_IMM)) return (void)protocol("a message without immediate data");
    const uint32_t word = ntohl(wc.imm_data), value = word & 0xFFFFFF;
    if (peer_ended_) return (void)protocol(fmt::format("a message (immediate {:#x}) after the end mark", word));
    switch (word >> 24) {
      case kMsgData:
      case kMsgCredit: {
        credits_ += value;
        if (value > static_cast<uint32_t>(conn_->theirs.credits) || credits_ > conn_->theirs.credits)
          return (void)protocol(
              fmt::format("the peer gave back {} credits, more than were lent ({})", value, conn_->theirs.credits));
        if (word >> 24 == kMsgCredit) {
          if (wc.byte_len != 0) return (void)protocol("a credit message with bytes");
          // Ours carry at least one credit: empty ones would be a flood no credit bounds.
          if (value == 0) return (void)protocol("a credit message that gives back none");
          repost(slot);
          return;
        }
        if (wc.byte_len == 0) return (void)protocol("an empty data message");
        // Slots that hold bytes the stream has not read, and credits not yet given back: the peer
        // may have at most `credits` of them.
        if (rx_.size() + static_cast<size_t>(owed_) >= static_cast<size_t>(conn_->mine.credits))
          return (void)protocol(
              fmt::format("the peer sent more messages than its {} credits (a flood)", conn_->mine.credits));
        rx_.push_back(Received{slot, wc.byte_len});
        return;
      }
      case kMsgEnd:
        peer_ended_ = true;
        repost(slot);
        return;
      default:
        return (void)protocol(fmt::format("message kind {} (immediate {:#x})", word >> 24, word));
    }
  }

  const std::unique_ptr<Connection> conn_;
  const UniqueFd socket_;
  const std::string peer_;

  // The worker's own.
  int credits_;          // data SENDs we may still post (the peer's free slots)
  uint32_t owed_ = 0;    // slots of the peer's we read and reposted, not yet told
  int sq_inflight_ = 0;  // our SENDs (data and credit) not yet completed
  std::deque<uint32_t> free_slots_;
  std::deque<Received> rx_;  // received bytes, in order, not yet read
  std::vector<ibv_wc> stash_;
  Status error_;
  bool peer_ended_ = false, socket_closed_ = false;

  std::atomic<bool> ended_{false};         // shutdown() ran
  std::atomic<bool> end_inflight_{false};  // its end mark is not yet acknowledged
  std::atomic<uint64_t> acked_{0};
};

}  // namespace

Depths control_depths() {
  Depths d;
  d.qps = 1;
  d.send = 64;
  d.recv = 64;  // grants the peer 32 data SENDs in flight; the rest takes credit and end messages
  d.max_chunk = kMinChunk;
  return d;
}

std::unique_ptr<stream::Conduit> make_control_conduit(std::unique_ptr<Connection> conn, UniqueFd socket,
                                                      std::string peer) {
  return std::make_unique<ControlConduit>(std::move(conn), std::move(socket), std::move(peer));
}

}  // namespace dmx::rdma
