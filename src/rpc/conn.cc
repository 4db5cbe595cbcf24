#include "rpc/conn.h"

#include <algorithm>
#include <string>

#include "rpc/server_shared.h"
#include "rpc/service.h"

namespace dmx::rpc {
namespace {
constexpr uint32_t kSpareCtrl = 2;  // control receives beyond one per slot
}

Conn::Conn(ServerShared& server, Endpoint ep, uint32_t partition)
    : server_(server), ep_(std::move(ep)), peer_(ep_.peer()), partition_(partition),
      key_(server.pool->partition_region(partition).key), slots_(server.config.pool.slots),
      ctrl_bufs_(server.config.pool.slots + kSpareCtrl) {}

Conn::~Conn() { dead_ = true; }

void Conn::start() {
  last_active_ = std::chrono::steady_clock::now().time_since_epoch().count();
  // Notifications come on the dmx thread that landed the payload: no hand-off to a thread of ours.
  ep_.on_notification([w = weak_from_this()](const Notification& n) {
    if (auto c = w.lock()) c->on_note(n);
  });
  // Control receives all carry one tag, so they match and complete in arrival order (dmx
  // completes receives in posting order: receives of different tags would wait on each other).
  for (uint32_t i = 0; i < ctrl_bufs_.size(); ++i) post_ctrl(i);
  Header hello;
  hello.kind = Kind::kHello;
  hello.slots = server_.config.pool.slots;
  hello.slot_size = server_.config.pool.slot_size;
  std::vector<unsigned char> region = server_.pool->partition_region(partition_).serialize();
  std::copy(region.begin(), region.end(), hello.region.begin());
  send_header(hello);
}

void Conn::on_note(const Notification& n) {
  if (dead_) return;
  if (n.key != key_) return refuse("a write into a region that is not its partition");
  Job job;
  Status error;
  std::string bad;
  {
    std::lock_guard<std::mutex> lock(mu_);
    uint32_t i = 0;
    while (i < slots_.size() && !(slots_[i].state == SlotState::kHeader && slots_[i].hdr.token == n.value)) ++i;
    if (i < slots_.size()) {
      if (n.length != slots_[i].hdr.payload_len)
        bad = "a payload of " + std::to_string(n.length) + " bytes where its header said " +
              std::to_string(slots_[i].hdr.payload_len);
      else ready_locked(i, job, error);
    } else if (early_.size() >= slots_.size()) {
      bad = "more payloads than slots without their headers";
    } else {
      early_.push_back({n.value, n.length, std::chrono::steady_clock::now() + server_.config.request_timeout});
    }
  }
  if (!bad.empty()) return refuse(bad);
  if (job.conn) server_.orchestrator->submit(std::move(job));
  else if (!error.ok()) finish(job, error);
}

void Conn::send_header(const Header& h) {
  auto wire = std::make_shared<Wire>(encode_header(h));  // lives until the send completes
  OpOptions o;
  o.timeout = server_.config.request_timeout;
  o.on_complete = [wire](const Status&, size_t) {};
  (void)ep_.send(MemRegion{wire->data(), wire->size(), {}}, kTagCtrl, o);
}

void Conn::post_ctrl(uint32_t i) {
  if (dead_) return;
  OpOptions o;
  o.on_complete = [w = weak_from_this(), i](const Status& s, size_t bytes) {
    if (auto c = w.lock()) c->on_ctrl(i, s, bytes);
  };
  (void)ep_.recv(MemRegion{ctrl_bufs_[i].data(), kHeaderSize, {}}, kTagCtrl, o);
}

void Conn::peer_gone(const Status& s) {
  if (dead_.exchange(true)) return;
  ++server_.disconnects;
  server_.note_dead();
}

void Conn::refuse(const std::string& why) {
  if (dead_.exchange(true)) return;
  server_.note_refusal("refused peer " + peer_ + ": " + why);
  Header h;
  h.kind = Kind::kRefused;
  h.status = static_cast<uint32_t>(Code::kProtocol);
  send_header(h);
}

void Conn::on_ctrl(uint32_t i, const Status& s, size_t bytes) {
  if (!s.ok()) {
    if (s.code() == Code::kTruncated) return refuse("a control header larger than 64 bytes");
    return peer_gone(s);
  }
  Result<Header> h = parse_header(ctrl_bufs_[i].data(), bytes);
  last_active_ = std::chrono::steady_clock::now().time_since_epoch().count();
  if (!h.ok()) return refuse(h.status().message());
  if (h->kind != Kind::kRequest) return refuse("a control header of kind " + std::to_string(int(h->kind)));
  const uint32_t slot_size = server_.config.pool.slot_size;
  if (h->slot >= slots_.size())
    return refuse("slot " + std::to_string(h->slot) + " of " + std::to_string(slots_.size()));
  if (h->payload_len > slot_size)
    return refuse("a payload of " + std::to_string(h->payload_len) + " bytes for a " + std::to_string(slot_size) +
                  "-byte slot");
  Job job;
  Status error;
  std::string bad;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Slot& sl = slots_[h->slot];
    if (sl.state != SlotState::kFree) {
      bad = "slot " + std::to_string(h->slot) + " reused while busy";
    } else {
      sl.hdr = *h;
      sl.state = SlotState::kHeader;
      sl.deadline = std::chrono::steady_clock::now() + server_.config.request_timeout;
      auto it = std::find_if(early_.begin(), early_.end(), [&](const EarlyNote& e) { return e.token == h->token; });
      if (it != early_.end()) {
        uint64_t len = it->length;
        early_.erase(it);
        if (len != h->payload_len)
          bad = "a payload of " + std::to_string(len) + " bytes where its header said " +
                std::to_string(h->payload_len);
        else ready_locked(h->slot, job, error);
      }
    }
  }
  if (!bad.empty()) return refuse(bad);
  post_ctrl(i);
  if (job.conn) server_.orchestrator->submit(std::move(job));
  else if (!error.ok()) finish(job, error);
}

void Conn::ready_locked(uint32_t local, Job& job, Status& error) {
  Slot& sl = slots_[local];
  sl.state = SlotState::kWork;
  ++busy_;
  ++server_.requests;
  Result<uint32_t> resp = response_size(sl.hdr.method, sl.hdr.payload_len);
  job.local = local;
  job.global = server_.pool->global(partition_, local);
  job.method = sl.hdr.method;
  job.len = sl.hdr.payload_len;
  if (!resp.ok() || *resp > server_.config.pool.slot_size) {
    error = resp.ok() ? Status(Code::kInvalidArgument, "response larger than a slot") : resp.status();
    return;  // job.conn stays empty: answered with an error header, no work
  }
  job.resp_len = *resp;
  job.conn = shared_from_this();
}

void Conn::finish(Job& job, const Status& status) {
  uint32_t local = job.local;
  job.conn.reset();  // the orchestrator's reference; callbacks hold weak ones
  uint64_t token;
  {
    std::lock_guard<std::mutex> lock(mu_);
    slots_[local].state = SlotState::kFree;
    token = slots_[local].hdr.token;
  }
  if (dead_) {
    --busy_;
    server_.note_dead();
    return;
  }
  if (!status.ok()) {
    ++server_.error_responses;
    Header h;
    h.kind = Kind::kResponse;
    h.slot = local;
    h.token = token;
    h.status = static_cast<uint32_t>(status.code());
    send_header(h);
    --busy_;
    return;
  }
  OpOptions o;
  o.timeout = server_.config.request_timeout;
  o.on_complete = [w = weak_from_this()](const Status& s, size_t) {
    if (auto c = w.lock()) c->on_sent(s);
  };
  // busy_ carries over from the job to the send.
  (void)ep_.send(server_.pool->response(job.global).sub(0, job.resp_len), resp_tag(local), o);
}

void Conn::on_sent(const Status& s) {
  last_active_ = std::chrono::steady_clock::now().time_since_epoch().count();
  --busy_;
  if (!s.ok()) return peer_gone(s);
  if (dead_) server_.note_dead();
}

void Conn::check_deadlines(std::chrono::steady_clock::time_point now) {
  std::string bad;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t i = 0; i < slots_.size() && bad.empty(); ++i)
      if (slots_[i].state == SlotState::kHeader && now > slots_[i].deadline)
        bad = "slot " + std::to_string(i) + ": the payload did not follow its header in time";
    for (const EarlyNote& e : early_)
      if (now > e.deadline) bad = "a payload whose header did not arrive in time";
  }
  if (!bad.empty()) refuse(bad);
}

std::chrono::steady_clock::duration Conn::idle(std::chrono::steady_clock::time_point now) {
  if (dead_ || busy_.load() != 0) return {};
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Slot& sl : slots_)
      if (sl.state != SlotState::kFree) return {};
    if (!early_.empty()) return {};
  }
  return now - std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(last_active_.load()));
}

void Conn::evict(const std::string& why) {
  if (dead_.exchange(true)) return;
  server_.note_refusal("evicted peer " + peer_ + ": " + why);
  Header h;
  h.kind = Kind::kRefused;
  h.status = static_cast<uint32_t>(Code::kResourceExhausted);
  send_header(h);
  close();
}

void Conn::close() {
  if (closed_.exchange(true)) return;
  dead_ = true;
  (void)ep_.close();  // after it dmx no longer writes into this partition's slots
  server_.pool->release_partition(partition_);
}

}  // namespace dmx::rpc
