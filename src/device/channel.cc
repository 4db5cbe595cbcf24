#include "device/channel.h"

#include <fmt/format.h>

#include <cassert>
#include <cstring>

#include "core/log.h"
#include "core/reaper.h"

namespace dmx::device {

static_assert(kDeviceInvalid == static_cast<int>(Code::kInvalidArgument));
static_assert(kDeviceTimeout == static_cast<int>(Code::kTimeout));
static_assert(kDeviceClosed == static_cast<int>(Code::kClosed));
static_assert(kDevicePeerFailed == static_cast<int>(Code::kPeerFailed));

namespace {
constexpr uint64_t kNoTicket = ~uint64_t{0};
// A descriptor longer than this is refused (a kernel bug, not a transfer).
constexpr uint64_t kMaxLength = uint64_t{1} << 40;
}  // namespace

struct Channel::Shared {
  DeviceDescriptor* ring;
  uint32_t slots;
  std::shared_ptr<Poster> poster;
  Channel::Options options;
  std::atomic<bool> stopping{false};
  uint64_t next = 0;  // the next ticket to take (the polling thread)
  std::atomic<uint64_t> completed_seen{0};

  std::mutex mu;                      // guards everything below
  DeviceControl* control;             // null once the channel is destroyed
  std::vector<uint8_t> done;          // per ticket % slots: 1 once complete
  uint64_t completed = 0;             // tickets below it are complete (control->completed)
  uint64_t failed_ticket = kNoTicket;  // control->failed_ticket
  Status error;                       // the first failure
  uint64_t notifications = 0;
  Channel::Stats stats;

  // Under mu. failed_ticket, then error, each published before `completed` moves past them.
  void record_failure(uint64_t ticket, const Status& why) {
    if (ticket < failed_ticket) {
      failed_ticket = ticket;
      if (control) device_ring::store_release(&control->failed_ticket, ticket);
    }
    if (error.ok()) {
      error = why;
      uint32_t code = static_cast<uint32_t>(why.code());
      if (code == 0) code = static_cast<uint32_t>(Code::kInternal);
      if (control) device_ring::store_release(&control->error, code);
    }
  }

  void complete(uint64_t ticket, const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    if (control == nullptr) return;
    if (!s.ok()) {
      ++stats.failed;
      record_failure(ticket, s);
    }
    done[ticket & (slots - 1)] = 1;
    while (completed < next_taken && done[completed & (slots - 1)]) {
      done[completed & (slots - 1)] = 0;
      ++completed;
      ++stats.completed;
    }
    device_ring::store_release(&control->completed, completed);
    completed_seen.store(completed, std::memory_order_release);
  }
  uint64_t next_taken = 0;  // under mu: tickets taken so far
};

Channel::Channel(DeviceDescriptor* ring, uint32_t slots, DeviceControl* control, std::shared_ptr<Poster> poster,
                 Options options)
    : shared_(std::make_shared<Shared>()) {
  assert(slots != 0 && (slots & (slots - 1)) == 0 && "slots: a power of two");
  std::memset(static_cast<void*>(ring), 0, sizeof(DeviceDescriptor) * slots);
  std::memset(static_cast<void*>(control), 0, sizeof(DeviceControl));
  control->failed_ticket = kNoTicket;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  shared_->ring = ring;
  shared_->slots = slots;
  shared_->poster = std::move(poster);
  shared_->options = std::move(options);
  shared_->control = control;
  shared_->done.assign(slots, 0);
}

Channel::~Channel() {
  stop(Status(Code::kClosed, "the endpoint's device channel was destroyed"));
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->control = nullptr;  // late completions write nothing
}

void Channel::start() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (thread_.joinable() || shared_->stopping.load()) return;
  thread_ = std::thread([sh = shared_] { run(sh); });
}

size_t Channel::poll() { return poll_shared(shared_); }

size_t Channel::poll_shared(const std::shared_ptr<Shared>& shared) {
  Shared& sh = *shared;
  size_t n = 0;
  while (!sh.stopping.load(std::memory_order_acquire)) {
    uint64_t t = sh.next;
    // At most `slots` outstanding: the done[] entry of t is free.
    if (t - sh.completed_seen.load(std::memory_order_acquire) >= sh.slots) break;
    DeviceDescriptor* slot = &sh.ring[t & (sh.slots - 1)];
    if (device_ring::load_acquire(&slot->seq) != t + 1) break;
    DeviceDescriptor d;
    std::memcpy(&d, slot, sizeof d);  // after the acquire: the kernel's fields
    sh.next = t + 1;
    Status bad;
    {
      std::lock_guard<std::mutex> lock(sh.mu);
      sh.next_taken = t + 1;
      ++sh.stats.taken;
      if (sh.control) device_ring::store_release(&sh.control->consumed, t + 1);
      if (!sh.error.ok()) bad = sh.error;
    }
    ++n;
    const bool direct = d.op == static_cast<uint32_t>(DeviceOpKind::kDirect);
    if (bad.ok()) {
      if (d.op != static_cast<uint32_t>(DeviceOpKind::kSend) && d.op != static_cast<uint32_t>(DeviceOpKind::kWrite) &&
          !direct)
        bad = Status(Code::kInvalidArgument, fmt::format("device descriptor {}: unknown operation {}", t, d.op));
      else if ((d.flags & ~kDeviceNotify) != 0 || (d.op != static_cast<uint32_t>(DeviceOpKind::kWrite) && d.flags != 0))
        bad = Status(Code::kInvalidArgument, fmt::format("device descriptor {}: unknown flags {:#x}", t, d.flags));
      else if (d.length > kMaxLength || (d.length > 0 && d.addr == 0))
        bad = Status(Code::kInvalidArgument,
                     fmt::format("device descriptor {}: {} B at {:#x} is not a source", t, d.length, d.addr));
      if (!bad.ok()) {
        std::lock_guard<std::mutex> lock(sh.mu);
        ++sh.stats.invalid;
      }
    }
    if (!bad.ok()) {
      sh.complete(t, bad.with_peer(sh.options.peer));
      continue;
    }
    if (direct) {  // the kernel moved the bytes itself: count them, nothing to post
      {
        std::lock_guard<std::mutex> lock(sh.mu);
        ++sh.stats.direct;
        sh.stats.direct_bytes += d.length;
      }
      sh.complete(t, Status());
      continue;
    }
    std::weak_ptr<Shared> weak = shared;
    sh.poster->post(d, [weak, t](const Status& s) {
      if (auto live = weak.lock()) live->complete(t, s);
    });
  }
  return n;
}

void Channel::fail(const Status& why) {
  Shared& sh = *shared_;
  std::lock_guard<std::mutex> lock(sh.mu);
  if (sh.control == nullptr) return;
  if (sh.error.ok()) DMX_LOG_DEBUG("device channel to {} failed: {}", sh.options.peer, why.to_string());
  // Everything not complete fails: the kernel's waits on those tickets return the code at once.
  sh.record_failure(sh.completed, why);
}

void Channel::stop(const Status& why) {
  fail(why);
  std::lock_guard<std::mutex> lock(stop_mu_);
  shared_->stopping.store(true, std::memory_order_release);
  join_or_reap(thread_);
}

void Channel::notify(uint64_t value) {
  Shared& sh = *shared_;
  std::lock_guard<std::mutex> lock(sh.mu);
  if (sh.control == nullptr) return;
  device_ring::store_release(&sh.control->last_notification, value);
  device_ring::store_release(&sh.control->notifications, ++sh.notifications);
}

Channel::Stats Channel::stats() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->stats;
}

void Channel::run(const std::shared_ptr<Shared>& sh) {
  using Clock = std::chrono::steady_clock;
  auto last_work = Clock::now();
  auto last_health = last_work;
  while (!sh->stopping.load(std::memory_order_acquire)) {
    size_t n = poll_shared(sh);
    auto now = Clock::now();
    if (n > 0) last_work = now;
    if (now - last_health >= sh->options.health_every) {
      last_health = now;
      Status h = sh->poster->health();  // may destroy the endpoint, and with it the Channel
      if (sh->stopping.load(std::memory_order_acquire)) break;
      if (!h.ok()) {
        std::lock_guard<std::mutex> lock(sh->mu);
        if (sh->control != nullptr && sh->error.ok()) sh->record_failure(sh->completed, h);
      }
    }
    if (n == 0) {
      if (now - last_work < sh->options.spin) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

}  // namespace dmx::device
