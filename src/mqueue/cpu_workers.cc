#include "mqueue/cpu_workers.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "mqueue/wait.h"

namespace dmx::mqueue {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kNoDeadline = Clock::time_point::max();

Clock::time_point deadline_after(Duration d) {
  return d == kForever ? kNoDeadline : Clock::now() + std::chrono::duration_cast<Clock::duration>(d);
}

// Worker w's client queue: call request into the call TX ring (response memory), reply from the
// call RX ring (worker memory). One call at a time per worker.
class CpuCallPort : public CallPort {
 public:
  CpuCallPort(QueueSet* q, uint32_t w, const std::atomic<bool>& stop) : q_(q), w_(w), stop_(stop) {}

  Result<size_t> call(std::span<const uint8_t> req, std::span<uint8_t> reply, Duration timeout) override {
    const Layout& l = q_->layout();
    const uint32_t c = l.g.call_slots;
    if (req.size() > l.g.max_call)
      return Status(Code::kOutOfRange, "call of " + std::to_string(req.size()) + " B over max_call");
    auto deadline = deadline_after(timeout);
    const uint32_t seq = seq_++;
    const uint32_t s = seq & (c - 1);
    uint8_t* wmem = q_->worker_base();
    // Credit: the dispatcher has taken call seq - C out, so its slot may be reused.
    auto credit = [&] { return seq - load_acquire(wmem, l.ctl_of(w_) + offsetof(WorkerCtl, call_credit)) < c; };
    if (WaitEnd e = wait_until(credit, stop_, deadline); e != WaitEnd::kReady) return ended(e, "a call credit");
    uint8_t* slot = q_->response_base() + l.ctx_slot(w_, s);
    SlotHeader h{static_cast<uint32_t>(req.size()), 0};
    std::memcpy(slot, &h, sizeof h);
    if (!req.empty()) std::memcpy(slot + sizeof h, req.data(), req.size());
    q_->store_response_word(l.ctx_flag(w_, s), seq + 1);
    auto replied = [&] { return load_acquire(wmem, l.crx_flag(w_, s)) == seq + 1; };
    if (WaitEnd e = wait_until(replied, stop_, deadline); e != WaitEnd::kReady) return ended(e, "the call reply");
    const uint8_t* rs = wmem + l.crx_slot(w_, s);
    std::memcpy(&h, rs, sizeof h);
    if (h.status != kSlotOk) return Status(Code::kPeerFailed, "call: the external service did not answer");
    if (h.len > l.g.max_call || h.len > reply.size())
      return Status(Code::kTruncated, "call: reply of " + std::to_string(h.len) + " B over the buffer");
    if (h.len) std::memcpy(reply.data(), rs + sizeof h, h.len);
    return size_t{h.len};
  }

 private:
  static Status ended(WaitEnd e, const char* what) {
    return e == WaitEnd::kStopped ? Status(Code::kClosed, std::string("call: stopped waiting for ") + what)
                                  : Status(Code::kTimeout, std::string("call: no ") + what + " in time");
  }
  QueueSet* q_;
  uint32_t w_;
  const std::atomic<bool>& stop_;
  uint32_t seq_ = 0;
};

}  // namespace

Result<std::unique_ptr<CpuWorkers>> CpuWorkers::start(QueueSet* queues, AppKind app, Duration call_timeout) {
  if (!queues->worker_host_accessible())
    return Status(Code::kInvalidArgument, "CPU workers need host worker memory, not " + to_string(queues->worker_where()));
  std::unique_ptr<CpuWorkers> w(new CpuWorkers(queues));
  w->call_timeout_ = call_timeout;
  for (uint32_t i = 0; i < queues->layout().g.workers; ++i)
    w->threads_.emplace_back(&CpuWorkers::run, w.get(), i, cpu_app(app, call_timeout, queues->layout().g.max_call));
  return w;
}

CpuWorkers::~CpuWorkers() { stop(); }

void CpuWorkers::stop() {
  stop_.store(true);
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

void CpuWorkers::run(uint32_t w, AppFn app) {
  const Layout& l = q_->layout();
  const uint32_t n = l.g.slots;
  uint8_t* wmem = q_->worker_base();
  uint8_t* rmem = q_->response_base();
  CpuCallPort port(q_, w, stop_);
  CallPort* calls = l.g.call_slots ? &port : nullptr;
  for (uint32_t seq = 0;; ++seq) {
    const uint32_t s = seq & (n - 1);
    auto arrived = [&] { return load_acquire(wmem, l.rx_flag(w, s)) == seq + 1 && !paused_.load(); };
    if (wait_until(arrived, stop_, kNoDeadline) != WaitEnd::kReady) return;
    // The response slot is free once the dispatcher has credited response seq - N.
    auto credit = [&] { return seq - load_acquire(wmem, l.ctl_of(w) + offsetof(WorkerCtl, tx_credit)) < n; };
    if (wait_until(credit, stop_, kNoDeadline) != WaitEnd::kReady) return;
    SlotHeader h;
    const uint8_t* req = wmem + l.rx_slot(w, s);
    std::memcpy(&h, req, sizeof h);
    uint8_t* out = rmem + l.tx_slot(w, s);
    std::span<uint8_t> resp(out + sizeof(SlotHeader), l.g.max_response);
    SlotHeader r{0, kSlotOk};
    if (h.len > l.g.max_request) {
      r.status = kSlotAppError;  // cannot happen unless the dispatcher is broken; never read past the slot
    } else {
      Result<size_t> got = app(std::span<const uint8_t>(req + sizeof h, h.len), resp, calls);
      if (got.ok()) {
        r.len = static_cast<uint32_t>(std::min<size_t>(*got, l.g.max_response));
      } else {
        std::string text = got.status().to_string();
        r.len = static_cast<uint32_t>(std::min<size_t>(text.size(), l.g.max_response));
        std::memcpy(resp.data(), text.data(), r.len);
        r.status = kSlotAppError;
      }
    }
    std::memcpy(out, &r, sizeof r);
    store_release(rmem, l.tx_flag(w, s), seq + 1);
    served_.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace dmx::mqueue
