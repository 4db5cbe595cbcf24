#include "rpc/client.h"

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

namespace dmx::rpc {
namespace {
constexpr uint32_t kMaxSlots = 4096;
constexpr uint32_t kMaxSlotSize = 64u << 20;
}  // namespace

class ClientImpl : public std::enable_shared_from_this<ClientImpl> {
 public:
  // A call's three operations (control send, payload send, response receive) must all complete
  // before `done` runs, so that dmx has let go of the caller's buffers.
  struct Slot {
    bool busy = false, draining = false, cancel_wanted = false, timed_out = false;
    int pending = 0;
    Wire wire{};
    Client::Done done;
    Status status, server_error;
    size_t resp_bytes = 0;
    Request resp_req;
    std::vector<unsigned char> scratch;  // drains a late response after a timeout
  };

  Endpoint ep_;
  uint32_t slot_size_ = 0;
  std::mutex mu_;  // guards slots_, free_, failed_, token_
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
  std::vector<Wire> ctrl_bufs_;
  Status failed_;
  uint64_t token_ = 0;

  Status hello(Duration timeout) {
    Wire w{};
    Request r = ep_.recv(MemRegion{w.data(), w.size(), {}}, kTagCtrl);
    Status s = r.wait(timeout);
    if (!s.ok()) {
      if (s.code() == Code::kTimeout) r.cancel();
      (void)r.wait(std::chrono::seconds(5));
      return s.code() == Code::kTruncated ? Status(Code::kProtocol, "rpc: server hello larger than 64 bytes") : s;
    }
    DMX_ASSIGN_OR_RETURN(Header h, parse_header(w.data(), r.bytes()));
    if (h.kind == Kind::kRefused)
      return Status(static_cast<Code>(h.status & 0xff), "rpc: the server refused this client (" +
                                                            std::string(code_name(static_cast<Code>(h.status & 0xff))) +
                                                            ")").with_peer(ep_.peer());
    if (h.kind != Kind::kHello || h.slots == 0 || h.slots > kMaxSlots || h.slot_size == 0 ||
        h.slot_size > kMaxSlotSize)
      return Status(Code::kProtocol, "rpc: bad hello from the server").with_peer(ep_.peer());
    slot_size_ = h.slot_size;
    slots_ = std::vector<Slot>(h.slots);
    for (uint32_t i = h.slots; i-- > 0;) free_.push_back(i);
    ctrl_bufs_.resize(h.slots + 2);
    for (uint32_t i = 0; i < ctrl_bufs_.size(); ++i) post_ctrl(i);
    return Status();
  }

  void post_ctrl(uint32_t i) {
    OpOptions o;
    o.on_complete = [w = weak_from_this(), i](const Status& s, size_t bytes) {
      if (auto c = w.lock()) c->on_ctrl(i, s, bytes);
    };
    (void)ep_.recv(MemRegion{ctrl_bufs_[i].data(), kHeaderSize, {}}, kTagCtrl, o);
  }

  void fail(const Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.ok()) failed_ = s;
  }

  void on_ctrl(uint32_t i, const Status& s, size_t bytes) {
    if (!s.ok()) return fail(s);
    Result<Header> h = parse_header(ctrl_bufs_[i].data(), bytes);
    if (!h.ok()) {
      fail(h.status().with_peer(ep_.peer()));
      (void)ep_.close();  // a server that breaks the protocol is not talked to again
      return;
    }
    if (h->kind == Kind::kRefused) {
      fail(Status(Code::kPeerFailed, "rpc: the server refused this client").with_peer(ep_.peer()));
      return;
    }
    Request cancel;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (h->kind == Kind::kResponse && h->slot < slots_.size() && slots_[h->slot].busy) {
        Slot& sl = slots_[h->slot];
        Code code = static_cast<Code>(h->status & 0xff);
        sl.server_error = Status(code == Code::kOk ? Code::kInternal : code, "rpc: the server answered with an error")
                              .with_peer(ep_.peer());
        sl.cancel_wanted = true;
        cancel = sl.resp_req;
      }
    }
    if (cancel.valid()) cancel.cancel();
    post_ctrl(i);
  }

  enum class Op { kCtrl, kData, kResp };

  void on_op(uint32_t slot, Op op, const Status& s, size_t bytes) {
    Client::Done done;
    Status final;
    size_t resp_bytes = 0;
    bool drain = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Slot& sl = slots_[slot];
      if (sl.draining) {  // the late response of a timed-out call: the slot is free again
        sl = Slot{};
        if (failed_.ok()) free_.push_back(slot);
        return;
      }
      if (op == Op::kResp) {
        sl.resp_bytes = bytes;
        if (s.code() == Code::kTimeout) sl.timed_out = true;
      }
      if (!s.ok() && sl.status.ok()) sl.status = s;
      if (--sl.pending > 0) return;
      final = !sl.server_error.ok() ? sl.server_error : sl.status;
      resp_bytes = final.ok() ? sl.resp_bytes : 0;
      done = std::move(sl.done);
      if (sl.timed_out && sl.server_error.ok() && failed_.ok()) {
        sl.draining = true;  // the response may still come: keep the slot until it has
        sl.scratch.resize(slot_size_);
        drain = true;
      } else {
        sl = Slot{};
        if (failed_.ok()) free_.push_back(slot);
      }
    }
    if (drain) {
      OpOptions o;
      o.on_complete = [w = weak_from_this(), slot](const Status& s2, size_t n) {
        if (auto c = w.lock()) c->on_op(slot, Op::kResp, s2, n);
      };
      Request r = ep_.recv(MemRegion{slots_[slot].scratch.data(), slot_size_, {}}, resp_tag(slot), o);
      std::lock_guard<std::mutex> lock(mu_);
      if (slots_[slot].draining) slots_[slot].resp_req = r;
    }
    if (done) done(final, resp_bytes);
  }

  Status submit(Method method, const MemRegion& req, const MemRegion& resp, Duration timeout, Client::Done done) {
    if (req.size > slot_size_)
      return Status(Code::kInvalidArgument, "rpc: a request of " + std::to_string(req.size) + " bytes exceeds the " +
                                                std::to_string(slot_size_) + "-byte slot");
    uint32_t slot;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed_.ok()) return failed_;
      if (free_.empty()) return Status(Code::kResourceExhausted, "rpc: every slot is busy");
      slot = free_.back();
      free_.pop_back();
      Slot& sl = slots_[slot];
      sl.busy = true;
      sl.pending = 3;
      sl.done = std::move(done);
      Header h;
      h.kind = Kind::kRequest;
      h.method = method;
      h.slot = slot;
      h.payload_len = static_cast<uint32_t>(req.size);
      h.token = ++token_;
      sl.wire = encode_header(h);
    }
    auto cb = [w = weak_from_this(), slot](Op op) {
      return [w, slot, op](const Status& s, size_t n) {
        if (auto c = w.lock()) c->on_op(slot, op, s, n);
      };
    };
    OpOptions o;
    o.timeout = timeout;
    o.on_complete = cb(Op::kResp);
    Request r = ep_.recv(resp, resp_tag(slot), o);
    bool cancel = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      slots_[slot].resp_req = r;
      cancel = slots_[slot].cancel_wanted;
    }
    if (cancel) r.cancel();
    o.on_complete = cb(Op::kCtrl);
    (void)ep_.send(MemRegion{slots_[slot].wire.data(), kHeaderSize, {}}, kTagCtrl, o);
    o.on_complete = cb(Op::kData);
    (void)ep_.send(req, data_tag(slot), o);
    return Status();
  }
};

Client::Client(std::shared_ptr<ClientImpl> impl) : impl_(std::move(impl)) {}
Client::~Client() { (void)close(); }

Result<std::unique_ptr<Client>> Client::connect(Context ctx, const std::string& address, Duration timeout) {
  auto impl = std::make_shared<ClientImpl>();
  DMX_ASSIGN_OR_RETURN(impl->ep_, ctx.connect(address));
  Status s = impl->hello(timeout);
  if (!s.ok()) {
    (void)impl->ep_.close();
    return s;
  }
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

uint32_t Client::slots() const { return static_cast<uint32_t>(impl_->slots_.size()); }
uint32_t Client::slot_size() const { return impl_->slot_size_; }

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
  // The operations carry the deadline; the margin only guards against a dmx bug. Past it the
  // endpoint is closed, which completes every operation, so the caller's buffers are free.
  auto margin = std::min<Duration>(timeout, std::chrono::hours(1)) + std::chrono::seconds(5);
  if (!w->cv.wait_for(lock, margin, [&] { return w->done; })) {
    lock.unlock();
    impl_->fail(Status(Code::kTimeout, "rpc: a call outlived its deadline; closing the client"));
    (void)close();
    lock.lock();
    w->cv.wait(lock, [&] { return w->done; });
  }
  if (!w->status.ok()) return w->status;
  return w->bytes;
}

Status Client::close() {
  impl_->fail(Status(Code::kClosed, "rpc: client closed"));
  return impl_->ep_.close();
}

}  // namespace dmx::rpc
