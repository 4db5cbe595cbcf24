#include "mqueue/remote_queue.h"

#include <cstring>

namespace dmx::mqueue {
namespace {

// Parses the answer of `bytes` in `rx` (WireHeader + payload) from `server`.
Result<Answer> parse_answer(const Buffer& rx, size_t bytes, uint32_t max, const std::string& server) {
  WireHeader h{};
  if (bytes < sizeof h) return Status(Code::kProtocol, "a " + std::to_string(bytes) + "-byte answer from " + server);
  std::memcpy(&h, rx.data(), sizeof h);
  if ((h.magic != kResponseMagic && h.magic != kErrorMagic) || h.len != bytes - sizeof h || h.len > max)
    return Status(Code::kProtocol, "a bad answer frame from " + server + " (magic " + std::to_string(h.magic) + ", " +
                                       std::to_string(h.len) + " of " + std::to_string(bytes) + " bytes)");
  Answer a;
  a.index = h.tag;
  a.ok = h.magic == kResponseMagic;
  const auto* p = static_cast<const uint8_t*>(rx.data()) + sizeof h;
  a.payload.assign(p, p + h.len);
  return a;
}

// Waits for `r` up to `timeout` (0: only looks): kTimeout if not done.
Status await(const Request& r, Duration timeout) {
  if (r.test()) return r.status();
  if (timeout.count() == 0) return Status(Code::kTimeout, "not yet");
  return r.wait(timeout);
}

}  // namespace

Result<std::unique_ptr<RemoteQueueClient>> RemoteQueueClient::connect(Context& ctx, const std::string& address,
                                                                      Duration timeout) {
  std::unique_ptr<RemoteQueueClient> c(new RemoteQueueClient());
  DMX_ASSIGN_OR_RETURN(c->ep_, ctx.connect(address));
  const std::string server = "Lynx server " + c->ep_.peer();
  WireHeader ask{kQueueMagic, 0, 0};
  std::vector<uint8_t> in(sizeof(WireHeader) + 4096);
  Request rr = c->ep_.recv(MemRegion{in.data(), in.size()}, kAnyTag);
  DMX_RETURN_IF_ERROR(c->ep_.send(MemRegion{&ask, sizeof ask}, 0).wait(timeout));
  Status st = rr.wait(timeout);
  if (!st.ok()) {
    rr.cancel();
    (void)rr.wait();
    return st;
  }
  WireHeader h{};
  if (rr.bytes() < sizeof h) return Status(Code::kProtocol, "a short answer to a queue request from " + server);
  std::memcpy(&h, in.data(), sizeof h);
  if (h.magic == kErrorMagic)
    return Status(Code::kUnavailable, server + " lends no queue: " +
                                          std::string(reinterpret_cast<const char*>(in.data() + sizeof h),
                                                      std::min<size_t>(h.len, rr.bytes() - sizeof h)));
  if (h.magic != kQueueMagic || h.len != sizeof(QueueGrant) || rr.bytes() != sizeof h + sizeof(QueueGrant))
    return Status(Code::kProtocol, "a bad queue grant from " + server);
  std::memcpy(&c->grant_, in.data() + sizeof h, sizeof c->grant_);
  const QueueGrant& g = c->grant_;
  DMX_ASSIGN_OR_RETURN(c->region_, RemoteRegion::parse(g.region, sizeof g.region));
  if (g.slots == 0 || (g.slots & (g.slots - 1)) || g.slots > kMaxSlots || g.first_slot >= g.slots ||
      g.slot_bytes < sizeof(SlotHeader) + uint64_t{g.max_request} || g.max_response > kMaxPayload ||
      uint64_t{g.slots} * g.slot_bytes > c->region_.size)
    return Status(Code::kProtocol, "a queue grant from " + server + " that does not add up");
  DMX_ASSIGN_OR_RETURN(c->src_, Buffer::allocate(MemSpec{MemKind::kHost, 0}, size_t{g.slots} * g.slot_bytes));
  DMX_ASSIGN_OR_RETURN(c->rx_, Buffer::allocate(MemSpec{MemKind::kHost, 0}, sizeof(WireHeader) + g.max_response));
  c->writes_.resize(g.slots);
  c->post_recv();
  return c;
}

void RemoteQueueClient::post_recv() {
  recv_ = ep_.recv(rx_.region(), kAnyTag);
}

Result<uint64_t> RemoteQueueClient::submit(std::span<const uint8_t> payload) {
  const QueueGrant& g = grant_;
  if (payload.size() > g.max_request)
    return Status(Code::kInvalidArgument, "request of " + std::to_string(payload.size()) + " B over max_request " +
                                              std::to_string(g.max_request));
  if (next_ - answered_ >= g.slots)
    return Status(Code::kResourceExhausted,
                  "remote queue full: " + std::to_string(g.slots) + " requests unanswered (wait for an answer)");
  const uint64_t index = next_;
  const uint64_t s = (g.first_slot + index) & (g.slots - 1), off = s * uint64_t{g.slot_bytes};
  if (writes_[s].valid()) DMX_RETURN_IF_ERROR(writes_[s].wait(std::chrono::seconds(10)));
  auto* slot = static_cast<uint8_t*>(src_.data()) + off;
  SlotHeader h{static_cast<uint32_t>(payload.size()), 0};
  std::memcpy(slot, &h, sizeof h);
  if (!payload.empty()) std::memcpy(slot + sizeof h, payload.data(), payload.size());
  OpOptions o;
  o.notify = true;
  o.notify_value = index;
  writes_[s] = ep_.write(src_.region().sub(off, sizeof h + payload.size()), region_, off, o);
  next_++;
  return index;
}

Result<Answer> RemoteQueueClient::next_answer(Duration timeout) {
  DMX_RETURN_IF_ERROR(await(recv_, timeout));
  DMX_ASSIGN_OR_RETURN(Answer a, parse_answer(rx_, recv_.bytes(), grant_.max_response, "Lynx server " + ep_.peer()));
  if (a.index != answered_)
    return Status(Code::kProtocol, "answer to index " + std::to_string(a.index) + " from Lynx server " + ep_.peer() +
                                       ", expected " + std::to_string(answered_));
  answered_++;
  post_recv();
  return a;
}

Status RemoteQueueClient::write_raw(uint64_t offset, std::span<const uint8_t> bytes, bool notify, uint64_t value,
                                    Duration timeout, uint64_t claimed_size) {
  RemoteRegion dst = region_;
  if (claimed_size) dst.size = claimed_size;
  DMX_ASSIGN_OR_RETURN(Buffer b, Buffer::allocate(MemSpec{MemKind::kHost, 0}, std::max<size_t>(bytes.size(), 1)));
  if (!bytes.empty()) std::memcpy(b.data(), bytes.data(), bytes.size());
  OpOptions o;
  o.notify = notify;
  o.notify_value = value;
  Request w = ep_.write(b.region().sub(0, bytes.size()), dst, offset, o);
  Status st = w.wait(timeout);
  if (st.code() == Code::kTimeout) {
    w.cancel();
    (void)w.wait();  // b stays alive until dmx lets go of it
  }
  return st;
}

Result<std::unique_ptr<DmxRequester>> DmxRequester::connect(Context& ctx, const std::string& address,
                                                            uint32_t max_payload) {
  std::unique_ptr<DmxRequester> c(new DmxRequester());
  DMX_ASSIGN_OR_RETURN(c->ep_, ctx.connect(address));
  c->max_ = max_payload;
  DMX_ASSIGN_OR_RETURN(c->tx_, Buffer::allocate(MemSpec{MemKind::kHost, 0}, sizeof(WireHeader) + max_payload));
  DMX_ASSIGN_OR_RETURN(c->rx_, Buffer::allocate(MemSpec{MemKind::kHost, 0}, sizeof(WireHeader) + max_payload + 4096));
  return c;
}

Status DmxRequester::submit(std::span<const uint8_t> payload, uint64_t tag) {
  if (payload.size() > max_) return Status(Code::kInvalidArgument, "request over the requester's max_payload");
  if (send_.valid() && !send_.test()) return Status(Code::kInvalidArgument, "a request is still being sent");
  WireHeader h{kRequestMagic, static_cast<uint32_t>(payload.size()), tag};
  std::memcpy(tx_.data(), &h, sizeof h);
  if (!payload.empty()) std::memcpy(static_cast<uint8_t*>(tx_.data()) + sizeof h, payload.data(), payload.size());
  recv_ = ep_.recv(rx_.region(), kAnyTag);
  send_ = ep_.send(tx_.region().sub(0, sizeof h + payload.size()), tag);
  return Status();
}

Result<Answer> DmxRequester::next_answer(Duration timeout) {
  DMX_RETURN_IF_ERROR(await(recv_, timeout));
  return parse_answer(rx_, recv_.bytes(), max_ + 4096, "Lynx server " + ep_.peer());
}

}  // namespace dmx::mqueue
