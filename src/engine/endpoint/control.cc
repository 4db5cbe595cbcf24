// Endpoint: the control stream moves (Session::multilink). Control frames (RTS, CTS, EAGER, ACK,
// READ_REQ, CANCEL, CREDIT, CLOSE: all but data chunks, KEEPALIVE, LINK_ACK and LINK_DOWN) are
// counted on both sides. The sender keeps each one (its bytes copied: an eager message's too) until
// the peer's count covers it; every LINK_ACK and LINK_DOWN carries in a2 how many of the sender's
// control frames landed, and the receiver sends a LINK_ACK(0, 0, count) every kCtlAckEvery of them.
// Counted frames go by one stream at a time. When it stops on this side, control frames go to the
// lowest stream still up (on another link first), but counted ones wait in the log until the
// peer's LINK_DOWN for the old stream says how many of them landed (final: the peer's end of that
// stream had stopped); then the rest go again, in order, and the new ones after them. None is lost, none lands twice, and
// the peer lands them in the order they were posted. LINK_ACK and LINK_DOWN are not counted:
// cumulative and idempotent, the ones the control stream carried are sent again on the next.
#include <fmt/format.h>

#include <cassert>

#include "core/log.h"
#include "engine/endpoint/endpoint_impl.h"
#include "engine/endpoint/internal.h"

namespace dmx {

using wire::FrameHeader;
using wire::FrameType;
using namespace endpoint;

namespace {

// The peer is told its count of our control frames at least this often.
constexpr uint64_t kCtlAckEvery = 32;
// Control frames kept for a peer that acknowledges none: past either bound the endpoint fails.
constexpr size_t kMaxCtlLog = size_t{1} << 16;
constexpr uint64_t kMaxCtlLogBytes = uint64_t{64} << 20;

stream::TxItem clone(const stream::TxItem& e) {
  stream::TxItem c;
  c.header = e.header;
  c.owned = e.owned;
  c.src = c.owned.data();
  c.len = c.owned.size();
  c.reply = e.reply;
  c.ctx = e.ctx;  // an eager send's op: completes when first written (on_sent)
  return c;
}

}  // namespace

bool EndpointImpl::counted_control(const FrameHeader& h) {
  switch (h.type) {
    case FrameType::kKeepalive:
    case FrameType::kLinkAck:
    case FrameType::kLinkDown:
      return false;
    case FrameType::kSendData:
    case FrameType::kReadData:
    case FrameType::kWriteData:
      return h.path != 0;  // a path's chunk header travels as a control frame
    default:
      return true;
  }
}

void EndpointImpl::push_item(stream::TxItem item) {
  if (!session_.multilink) {
    streams_[0]->push_control(std::move(item));
    return;
  }
  std::lock_guard<std::mutex> g(ctl_mu_);
  stream::Stream& to = control_stream();
  if (!counted_control(item.header)) {
    to.push_control(std::move(item));
    return;
  }
  assert(item.len == item.owned.size() && (item.len == 0 || item.src == item.owned.data()) &&
         "a control frame's bytes are its own: it may be sent again");
  ++ctl_sent_;
  ctl_log_bytes_ += item.len;
  ctl_log_.push_back(clone(item));
  if ((ctl_log_.size() > kMaxCtlLog || ctl_log_bytes_ > kMaxCtlLogBytes) && !ctl_overflow_.exchange(true))
    to.wake();  // its on_tick fails the endpoint
  if (ctl_hold_) return;
  ctl_used_ = ctl_stream_.load();
  to.push_control(std::move(item));
}

Status EndpointImpl::ctl_acked(const FrameHeader& h) {
  std::lock_guard<std::mutex> g(ctl_mu_);
  if (h.a2 > ctl_sent_)
    return protocol(fmt::format("{}: {} of our control frames landed, but {} were sent", wire::describe(h), h.a2,
                                ctl_sent_));
  while (ctl_acked_ < h.a2 && !ctl_log_.empty()) {
    ctl_log_bytes_ -= ctl_log_.front().len;
    ctl_log_.pop_front();
    ++ctl_acked_;
  }
  return Status();
}

// Caller holds mu_.
void EndpointImpl::ctl_push_ack() {
  FrameHeader ack;
  ack.type = FrameType::kLinkAck;
  ack.a2 = ctl_landed_;
  ctl_ack_sent_ = ctl_landed_;
  push_control(ack);
}

// Caller holds mu_.
void EndpointImpl::ctl_landed(const FrameHeader& h) {
  if (!session_.multilink || !counted_control(h)) return;
  if (++ctl_landed_ - ctl_ack_sent_ >= kCtlAckEvery) ctl_push_ack();
}

// Caller holds mu_.
bool EndpointImpl::ctl_stream_stopped(int k) {
  std::lock_guard<std::mutex> g(ctl_mu_);
  // Counted frames that went by k may still be landing at the peer: later ones wait for its count.
  if (k == ctl_used_ && ctl_acked_ < ctl_sent_) ctl_hold_ = true;
  if (k != ctl_stream_.load()) return false;
  // The lowest stream up, on another link than k's if there is one: k's link may be what died, and
  // its other streams may not have noticed yet.
  auto route_of = [&](size_t i) -> const std::string& {
    static const std::string kNone;
    return i < session_.routes.size() ? session_.routes[i] : kNone;
  };
  const std::string& dead = route_of(static_cast<size_t>(k));
  std::string dead_local;  // the address of k's interface: "10.0.0.1" of "10.0.0.1:40000 -> 10.0.0.2:7000"
  if (!dead.empty()) {
    std::string local = dead.substr(0, dead.find(' '));
    dead_local = local.substr(0, local.rfind(':'));
  }
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < links_.size(); ++i) {
      const LinkState& l = links_[i];
      if (l.stopped || !l.why.ok() || l.down_got) continue;
      const std::string& route = route_of(i);
      if (pass == 0 && !dead_local.empty() && route.rfind(dead_local + ":", 0) == 0) continue;  // the same link
      ctl_stream_.store(static_cast<int>(i));
      DMX_LOG_WARN("endpoint to {}: control stream {} is down; control frames move to stream {} ({})", session_.peer,
                   k, i, route);
      streams_[i]->wake();  // it calls on_tick from now on
      return true;
    }
  }
  return false;  // none left: link_stopped fails the endpoint
}

// Caller holds mu_.
void EndpointImpl::ctl_repeat_links() {
  for (const FrameHeader& d : downs_sent_) push_control(d);
  for (size_t k = 1; k < links_.size(); ++k) {
    if (links_[k].stopped) continue;
    FrameHeader ack;
    ack.type = FrameType::kLinkAck;
    ack.a0 = k;
    ack.a1 = links_[k].landed;
    ack.a2 = ctl_landed_;
    push_control(ack);
  }
  ctl_push_ack();
}

// Caller holds mu_.
void EndpointImpl::ctl_resend_if_ready(int k) {
  std::lock_guard<std::mutex> g(ctl_mu_);
  if (!ctl_hold_ || k != ctl_used_) return;
  const LinkState& l = links_[static_cast<size_t>(k)];
  if (!l.stopped || !l.down_got) return;
  stream::Stream& to = control_stream();
  if (!ctl_log_.empty())
    DMX_LOG_WARN("endpoint to {}: stream {} now sends the {} control frame(s) the peer has not landed (stream {} is down)",
                 session_.peer, ctl_stream_.load(), ctl_log_.size(), k);
  for (const stream::TxItem& e : ctl_log_) to.push_control(clone(e));
  ctl_used_ = ctl_stream_.load();
  ctl_hold_ = false;
}

}  // namespace dmx
