// Endpoint: several links (Session::multilink). Each data stream's chunks are kept until the peer
// says they landed: the receiver counts the data frames each stream landed and tells the sender
// on the control stream (LINK_ACK: stream, count). A stream that dies (its socket fails, or the
// peer is silent on it past busy_peer_timeout) does not end the endpoint: once it has stopped on
// this side (nothing more lands or leaves by it), this side says how many of the peer's frames it
// landed from it (LINK_DOWN: stream, count) and stops taking them; each side, once its own stream
// stopped and the peer's LINK_DOWN came, sends again by the other streams every chunk it pulled
// for that stream beyond the peer's count. Frames on one stream land in order, so the count says
// exactly which landed: none lands twice, none is lost. A header whose payload had not landed when
// the stream stopped gives back its reservation. The control stream (stream 0 first) moves the same
// way (endpoint/control.cc); when the last data stream is gone, the endpoint fails, or with
// reconnect_timeout waits for new streams (endpoint/reconnect.cc).
#include <fmt/format.h>

#include "core/log.h"
#include "engine/endpoint/endpoint_impl.h"
#include "engine/endpoint/internal.h"

namespace dmx {

using wire::FrameHeader;
using wire::FrameType;
using namespace endpoint;

// Caller holds mu_.
void EndpointImpl::link_pulled(int stream, stream::TxItem* out, const Transfer* t) {
  auto c = std::make_shared<SentChunk>();
  c->op = t->op;
  c->header = out->header;
  c->src = static_cast<const char*>(out->src);
  c->where = out->where;
  c->len = out->len;
  if (!out->pieces.empty()) {
    c->table = out->owned;
    c->pieces = out->pieces;
  }
  out->ctx = c;
  links_[static_cast<size_t>(stream)].unacked.push_back(std::move(c));
}

// Caller holds mu_.
bool EndpointImpl::link_resend(int stream, stream::TxItem* out) {
  if (resend_.empty()) return false;
  std::shared_ptr<SentChunk> c = std::move(resend_.front());
  resend_.pop_front();
  out->header = c->header;
  out->src = c->src;
  out->where = c->where;
  out->len = c->len;
  if (!c->pieces.empty()) {
    out->owned = c->table;
    out->pieces = c->pieces;
    out->src = out->owned.data();
  }
  out->ctx = c;
  links_[static_cast<size_t>(stream)].unacked.push_back(std::move(c));
  if (striping_) striping_->took(stream);
  return true;
}

// The chunk is written; it completes when the peer acknowledges it. Caller holds mu_.
void EndpointImpl::link_sent(int, stream::TxItem& item) {
  auto c = std::static_pointer_cast<SentChunk>(item.ctx);
  if (session_.checksum && !c->folded) {
    c->folded = true;
    fold_chunk(*c->op, chunk_offset(*c->op, item.header), item.len, item.header.crc);
  }
}

// Caller holds mu_.
void EndpointImpl::link_planned(int stream, const FrameHeader& h, const stream::RxPlan& plan) {
  links_[static_cast<size_t>(stream)].arriving.push_back(LinkState::Arriving{h, plan.host_tag == kTagCounted});
}

// Caller holds mu_.
void EndpointImpl::link_landed(int stream, const FrameHeader&) {
  LinkState& l = links_[static_cast<size_t>(stream)];
  if (!l.arriving.empty()) l.arriving.pop_front();
  ++l.landed;
  FrameHeader ack;
  ack.type = FrameType::kLinkAck;
  ack.a0 = static_cast<uint64_t>(stream);
  ack.a1 = l.landed;
  ack.a2 = ctl_landed_;
  ctl_ack_sent_ = ctl_landed_;
  push_control(ack);
}

bool EndpointImpl::link_failed(int stream, const Status& s) {
  if (!session_.multilink) return false;
  if (s.code() != Code::kPeerFailed && s.code() != Code::kIo && s.code() != Code::kClosed) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (!status_.ok() || (links_alive_ == 0 && !reconnecting_)) return false;
  LinkState& l = links_[static_cast<size_t>(stream)];
  l.why = s;
  const std::string& route = static_cast<size_t>(stream) < session_.routes.size() ? session_.routes[stream] : "";
  DMX_LOG_WARN("endpoint to {}: stream {} ({}) is down: {}; its frames move to the other links", session_.peer,
               stream, route, s.message());
  return true;
}

// Stream `stream` has stopped (its worker let go): give back what was planned and not landed, and
// tell the peer. Called without mu_.
void EndpointImpl::link_stopped(int stream) {
  Status last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    LinkState& l = links_[static_cast<size_t>(stream)];
    if (!status_.ok() || l.stopped) return;
    l.stopped = true;
    if (stream != 0) {  // a data stream
      --links_alive_;
      if (striping_) striping_->down(stream);
    }
    for (const LinkState::Arriving& a : l.arriving) {
      const FrameHeader& h = a.header;
      uint64_t len = h.payload_len - wire::inline_table_bytes(h);
      if (h.type == FrameType::kWriteData) {
        auto it = in_writes_.find(h.id);
        if (it != in_writes_.end() && it->second.reserved >= len) it->second.reserved -= len;
        continue;
      }
      auto& map = h.type == FrameType::kSendData ? tokens_ : reads_;
      auto it = map.find(h.id);
      if (it == map.end()) continue;
      Inbound& in = it->second;
      if (in.reserved >= len) in.reserved -= len;
      if (a.counted && in.op) {
        --in.op->inflight;
        if (in.op->phase == OpPhase::kStopping) settle_stopped(in.op);
      }
    }
    l.arriving.clear();
    if (links_alive_ > 0) {
      bool moved = ctl_stream_stopped(stream);
      FrameHeader down;
      down.type = FrameType::kLinkDown;
      down.a0 = static_cast<uint64_t>(stream);
      down.a1 = l.landed;
      down.a2 = ctl_landed_;  // final for this stream: nothing more lands by it
      downs_sent_.push_back(down);
      push_control(down);
      if (moved) ctl_repeat_links();
      if (l.down_got && stream != 0) link_requeue(stream);
      ctl_resend_if_ready(stream);
    } else {
      last = l.why.ok() ? Status(Code::kPeerFailed, "the peer ended its last data stream") : l.why;
      if (reconnecting_ || (stream != 0 && reconnect_on() && begin_outage(last))) {
        // An outage (endpoint/reconnect.cc): the LINK_DOWN goes by the stream a rejoin brings.
        (void)ctl_stream_stopped(stream);
        FrameHeader down;
        down.type = FrameType::kLinkDown;
        down.a0 = static_cast<uint64_t>(stream);
        down.a1 = l.landed;
        down.a2 = ctl_landed_;
        downs_sent_.push_back(down);
        if (l.down_got && stream != 0) link_requeue(stream);
        last = Status();
      }
    }
  }
  if (!last.ok()) {
    fail(Status(Code::kPeerFailed, fmt::format("no link to the peer is left (the last, data stream {}: {})", stream,
                                               last.message())));
  }
  deliver();
}

// Caller holds mu_.
void EndpointImpl::link_acked(int k, uint64_t upto) {
  LinkState& l = links_[static_cast<size_t>(k)];
  while (l.acked < upto && !l.unacked.empty()) {
    std::shared_ptr<SentChunk> c = std::move(l.unacked.front());
    l.unacked.pop_front();
    ++l.acked;
    if (striping_) striping_->wrote(k);
    chunk_sent(c->op, c->len - wire::inline_table_bytes(c->header), Status());
  }
}

// Caller holds mu_.
void EndpointImpl::link_requeue(int k) {
  LinkState& l = links_[static_cast<size_t>(k)];
  link_acked(k, l.peer_landed);
  if (l.unacked.empty()) return;
  DMX_LOG_WARN("endpoint to {}: sending again by the other links {} chunk(s) of data stream {} that did not land",
               session_.peer, l.unacked.size(), k);
  for (auto& c : l.unacked) resend_.push_back(std::move(c));
  l.unacked.clear();
  has_tx_.store(true, std::memory_order_release);
  wake_streams();
}

namespace {

// What is wrong with a LINK_ACK's or LINK_DOWN's stream (a0, a1), said to the peer; empty: nothing.
std::string link_frame_fault(bool multilink, size_t streams, const FrameHeader& h) {
  if (!multilink) return "on an endpoint without several links";
  if (h.a0 >= streams) return fmt::format("for stream {}, of {} streams", h.a0, streams);
  if (h.a0 == 0 && h.a1 != 0) return fmt::format("counts {} data frames on stream 0, the control stream", h.a1);
  return "";
}

}  // namespace

// LINK_ACK and LINK_DOWN may come on any stream, and again after the control stream moved (the
// copies it carried are repeated): an older count is no news.
Status EndpointImpl::on_link_ack(int, const FrameHeader& h) {
  if (std::string why = link_frame_fault(session_.multilink, links_.size(), h); !why.empty())
    return protocol(fmt::format("{} {}", wire::describe(h), why));
  DMX_RETURN_IF_ERROR(ctl_acked(h));
  if (h.a0 == 0) return Status();  // control frames only
  LinkState& l = links_[h.a0];
  if (h.a1 <= l.acked) return Status();
  if (h.a1 - l.acked > l.unacked.size())
    return protocol(fmt::format("{}: {} frames acknowledged, but {} were sent", wire::describe(h), h.a1,
                                l.acked + l.unacked.size()));
  link_acked(static_cast<int>(h.a0), h.a1);
  return Status();
}

Status EndpointImpl::on_link_down(int, const FrameHeader& h) {
  if (std::string why = link_frame_fault(session_.multilink, links_.size(), h); !why.empty())
    return protocol(fmt::format("{} {}", wire::describe(h), why));
  DMX_RETURN_IF_ERROR(ctl_acked(h));
  LinkState& l = links_[h.a0];
  if (l.down_got) {
    if (h.a1 == l.peer_landed) return Status();  // repeated after the control stream moved
    return protocol(fmt::format("{}: a second one, {} frames landed where the first said {}", wire::describe(h),
                                h.a1, l.peer_landed));
  }
  if (h.a1 < l.acked || h.a1 - l.acked > l.unacked.size())
    return protocol(fmt::format("{}: {} frames landed of {} sent", wire::describe(h), h.a1, l.acked + l.unacked.size()));
  l.down_got = true;
  l.peer_landed = h.a1;
  if (l.why.ok()) l.why = Status(Code::kPeerFailed, "the peer found it dead");
  if (l.stopped) {
    if (h.a0 != 0) link_requeue(static_cast<int>(h.a0));
    ctl_resend_if_ready(static_cast<int>(h.a0));
  } else {
    streams_[h.a0]->stop();  // its on_stream_stopped requeues
  }
  return Status();
}

}  // namespace dmx
