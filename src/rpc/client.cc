#include "rpc/client.h"

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dmx::rpc {
namespace {
constexpr uint32_t kMaxSlots = 4096;
constexpr uint32_t kMaxSlotSize = 64u << 20;
constexpr uint32_t kRing = 4;  // receives posted for responses (one tag: they complete in order)
using Clock = std::chrono::steady_clock;
}  // namespace

class ClientImpl : public std::enable_shared_from_this<ClientImpl> {
 public:
  // A call has three parts: the control send, the payload write and the response. `done` runs
  // once all three ended, so that dmx has let go of the caller's buffers.
  struct Slot {
    bool busy = false, answered = false, late = false;  // late: timed out, response still due
    int pending = 0;
    Wire wire{};
    MemRegion resp;
    Client::Done done;
    Status status;
    size_t resp_bytes = 0;
    Clock::time_point deadline;
  };
  struct RingEntry {
    std::vector<unsigned char> buf;
  };

  Endpoint ep_;
  RemoteRegion region_;
  uint32_t slot_size_ = 0;
  uint64_t stride_ = 0;
  std::mutex mu_;  // guards everything below
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
  std::vector<RingEntry> ring_;  // entry i: only its own completion (and hello, before) touches it
  Status failed_;
  uint64_t token_ = 0;
  bool closing_ = false;
  std::condition_variable closing_cv_;
  std::thread timer_;

  Status hello(Duration timeout) {
    Wire w{};
    Request r = ep_.recv(MemRegion{w.data(), w.size(), {}}, kTagCtrl);
    Status s = r.wait(timeout);
    if (!s.ok()) {
      r.cancel();
      (void)r.wait(std::chrono::seconds(5));
      return s.code() == Code::kTruncated ? Status(Code::kProtocol, "rpc: server hello larger than 64 bytes") : s;
    }
    DMX_ASSIGN_OR_RETURN(Header h, parse_header(w.data(), r.bytes()));
    if (h.kind == Kind::kRefused) {
      Code c = static_cast<Code>(h.status & 0xff);
      return Status(c, "rpc: the server refused this client (" + std::string(code_name(c)) + ")").with_peer(ep_.peer());
    }
    if (h.kind != Kind::kHello || h.slots == 0 || h.slots > kMaxSlots || h.slot_size == 0 ||
        h.slot_size > kMaxSlotSize)
      return Status(Code::kProtocol, "rpc: bad hello from the server").with_peer(ep_.peer());
    DMX_ASSIGN_OR_RETURN(region_, RemoteRegion::parse(h.region.data(), h.region.size()));
    slot_size_ = h.slot_size;
    stride_ = slot_stride(h.slot_size);
    if (region_.size / stride_ < h.slots) return Status(Code::kProtocol, "rpc: hello region smaller than its slots");
    slots_ = std::vector<Slot>(h.slots);
    for (uint32_t i = h.slots; i-- > 0;) free_.push_back(i);
    ring_ = std::vector<RingEntry>(kRing);
    for (auto& e : ring_) e.buf.resize(std::max<size_t>(slot_size_, kHeaderSize));
    for (uint32_t i = 0; i < kRing; ++i) post_ring(i);
    timer_ = std::thread([this] { timer_loop(); });
    return Status();
  }

  // Responses are taken in the ring's completion callbacks, on the dmx thread that received them
  // (no hand-off to a thread of ours); dmx completes them in posting order. The entry is posted
  // again once its bytes were copied out.
  void post_ring(uint32_t i) {
    OpOptions o;
    o.on_complete_tag = [w = weak_from_this(), i](const Status& s, size_t n, uint64_t tag) {
      if (auto c = w.lock())
        if (c->handle(i, s, tag, n)) c->post_ring(i);
    };
    (void)ep_.recv(MemRegion{ring_[i].buf.data(), ring_[i].buf.size(), {}}, kAnyTag, o);
  }

  // Ends calls whose deadline passed, every 5 ms, until the client closes.
  void timer_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!closing_) {
      closing_cv_.wait_for(lock, std::chrono::milliseconds(5));
      if (closing_) return;
      lock.unlock();
      check_deadlines();
      lock.lock();
    }
  }

  // One message from the server; false when the connection is over.
  bool handle(uint32_t i, const Status& s, uint64_t tag, size_t n) {
    if (!s.ok()) {
      fail(s);
      return false;
    }
    const unsigned char* buf = ring_[i].buf.data();
    if (tag == kTagCtrl) {
      Result<Header> h = parse_header(buf, n);
      if (!h.ok() || h->kind == Kind::kHello || h->kind == Kind::kRequest) {
        return protocol(h.ok() ? "rpc: unexpected control header from the server" : h.status().message());
      }
      if (h->kind == Kind::kRefused) {
        fail(Status(Code::kPeerFailed, "rpc: the server refused this client").with_peer(ep_.peer()));
        return false;
      }
      Code c = static_cast<Code>(h->status & 0xff);
      answer(h->slot, Status(c == Code::kOk ? Code::kInternal : c, "rpc: the server answered with an error")
                          .with_peer(ep_.peer()), nullptr, 0);
      return true;
    }
    if ((tag & kTagMask) != kTagResp)
      return protocol("rpc: a message with an unknown tag " + std::to_string(tag) + " from the server");
    answer(static_cast<uint32_t>(tag), Status(), buf, n);
    return true;
  }

  bool protocol(const std::string& why) {
    fail(Status(Code::kProtocol, why).with_peer(ep_.peer()));
    (void)ep_.close();  // a server that breaks the protocol is not talked to again
    return false;
  }

  // The response part of a call: copies the response into the caller's buffer.
  void answer(uint32_t slot, Status s, const unsigned char* buf, size_t n) {
    MemRegion resp;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (slot >= slots_.size() || !slots_[slot].busy || slots_[slot].answered) return;  // stale
      Slot& sl = slots_[slot];
      if (sl.late) {  // the call already ended with a timeout: the slot is free once all parts are
        if (sl.pending > 0) {
          sl.late = false;
          sl.answered = true;
        } else {
          sl = Slot{};
          if (failed_.ok()) free_.push_back(slot);
        }
        return;
      }
      resp = sl.resp;
    }
    if (s.ok() && n > resp.size)
      s = Status(Code::kTruncated, "rpc: a response of " + std::to_string(n) + " bytes for a " +
                                       std::to_string(resp.size) + "-byte buffer");
    if (s.ok() && n > 0) s = copy_memory(resp.sub(0, n), MemRegion{const_cast<unsigned char*>(buf), n, {}});
    part_done(slot, s, n, true);
  }

  void part_done(uint32_t slot, const Status& s, size_t n, bool response) {
    Client::Done done;
    Status final;
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Slot& sl = slots_[slot];
      if (response) {
        sl.answered = true;
        sl.resp_bytes = n;
      }
      if (!s.ok() && sl.status.ok()) sl.status = s;
      if (--sl.pending > 0) return;
      final = sl.status;
      bytes = final.ok() ? sl.resp_bytes : 0;
      done = std::move(sl.done);
      if (sl.late) {
        sl.done = nullptr;  // keep the slot until the late response comes (answer() frees it)
      } else {
        sl = Slot{};
        if (failed_.ok()) free_.push_back(slot);
      }
    }
    if (done) done(final, bytes);
  }

  // Ends calls whose deadline passed with kTimeout; their slots wait for the late response.
  void check_deadlines() {
    auto now = Clock::now();
    for (uint32_t i = 0; i < slots_.size(); ++i) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        Slot& sl = slots_[i];
        if (!sl.busy || sl.answered || sl.late || now < sl.deadline) continue;
        sl.late = true;
      }
      part_done(i, Status(Code::kTimeout, "rpc: no response before the deadline").with_peer(ep_.peer()), 0, true);
      std::lock_guard<std::mutex> lock(mu_);
      slots_[i].answered = false;  // the late response still frees the slot
    }
  }

  void fail(const Status& s) {
    std::vector<uint32_t> open;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_.ok()) failed_ = s;
      for (uint32_t i = 0; i < slots_.size(); ++i)
        if (slots_[i].busy && !slots_[i].answered && !slots_[i].late) open.push_back(i);
    }
    for (uint32_t i : open) {
      std::lock_guard<std::mutex> lock(mu_);
      slots_[i].late = true;  // no response will come: end the response part now
    }
    for (uint32_t i : open) part_done(i, s, 0, true);
  }

  Status submit(Method method, const MemRegion& req, const MemRegion& resp, Duration timeout, Client::Done done) {
    if (req.size > slot_size_)
      return Status(Code::kInvalidArgument, "rpc: a request of " + std::to_string(req.size) + " bytes exceeds the " +
                                                std::to_string(slot_size_) + "-byte slot");
    uint32_t slot;
    uint64_t token;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed_.ok()) return failed_;
      if (free_.empty()) return Status(Code::kResourceExhausted, "rpc: every slot is busy");
      slot = free_.back();
      free_.pop_back();
      Slot& sl = slots_[slot];
      sl = Slot{};
      sl.busy = true;
      sl.pending = 3;
      sl.resp = resp;
      sl.done = std::move(done);
      sl.deadline = Clock::now() + std::min<Duration>(timeout, std::chrono::hours(24 * 365));
      Header h;
      h.kind = Kind::kRequest;
      h.method = method;
      h.slot = slot;
      h.payload_len = static_cast<uint32_t>(req.size);
      h.token = token = ++token_;
      sl.wire = encode_header(h);
    }
    auto part = [w = weak_from_this(), slot](const Status& s, size_t) {
      if (auto c = w.lock()) c->part_done(slot, s, 0, false);
    };
    OpOptions o;
    o.timeout = timeout;
    o.on_complete = part;
    (void)ep_.send(MemRegion{slots_[slot].wire.data(), kHeaderSize, {}}, kTagCtrl, o);
    // The payload goes straight into the slot; the notification tells the server it landed.
    o.notify = true;
    o.notify_value = token;
    (void)ep_.write(req, region_, slot * stride_, o);
    return Status();
  }

  Status close() {
    fail(Status(Code::kClosed, "rpc: client closed"));
    Status s = ep_.close();
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
      closing_cv_.notify_all();
    }
    if (timer_.joinable() && timer_.get_id() != std::this_thread::get_id()) timer_.join();
    return s;
  }
};

Client::Client(std::shared_ptr<ClientImpl> impl) : impl_(std::move(impl)) {}
Client::~Client() { (void)close(); }

Result<std::unique_ptr<Client>> Client::connect(Context ctx, const std::string& address, Duration timeout) {
  auto impl = std::make_shared<ClientImpl>();
  DMX_ASSIGN_OR_RETURN(impl->ep_, ctx.connect(address));
  Status s = impl->hello(timeout);
  if (!s.ok()) {
    (void)impl->close();
    return s;
  }
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

uint32_t Client::slots() const { return static_cast<uint32_t>(impl_->slots_.size()); }
uint32_t Client::slot_size() const { return impl_->slot_size_; }
std::string Client::transport() const { return impl_->ep_.stats().transport; }

Status Client::submit(Method method, const MemRegion& req, const MemRegion& resp, Duration timeout, Done done) {
  return impl_->submit(method, req, resp, timeout, std::move(done));
}

Result<size_t> Client::call(Method method, const MemRegion& req, const MemRegion& resp, Duration timeout) {
  struct Waiter {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    Status status;
    size_t bytes = 0;
  };
  auto w = std::make_shared<Waiter>();
  DMX_RETURN_IF_ERROR(submit(method, req, resp, timeout, [w](const Status& s, size_t n) {
    std::lock_guard<std::mutex> lock(w->mu);
    w->done = true;
    w->status = s;
    w->bytes = n;
    w->cv.notify_all();
  }));
  std::unique_lock<std::mutex> lock(w->mu);
  // The timer thread and the operations carry the deadline; the margin guards against a bug. Past
  // it the client is closed, which ends every part, so the caller's buffers are free.
  auto margin = std::min<Duration>(timeout, std::chrono::hours(1)) + std::chrono::seconds(5);
  if (!w->cv.wait_for(lock, margin, [&] { return w->done; })) {
    lock.unlock();
    (void)close();
    lock.lock();
    w->cv.wait(lock, [&] { return w->done; });
  }
  if (!w->status.ok()) return w->status;
  return w->bytes;
}

Status Client::close() { return impl_->close(); }

}  // namespace dmx::rpc
