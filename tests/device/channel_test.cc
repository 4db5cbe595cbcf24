// The host side of kernel-initiated operations (device/channel.h), with host threads playing the
// kernel through the very protocol functions the kernel runs (dmx/device_handle.h: same memory
// orders, system scope on the GPU, std::atomic_ref here).
#include "device/channel.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <thread>
#include <vector>

namespace dmx::device {
namespace {

using namespace std::chrono_literals;
namespace ring = device_ring;

// The handle's memory, as the engine lays it out (ring, control, ticket counter), in host memory.
struct Memory {
  explicit Memory(uint32_t slots) : ring(slots), control(new DeviceControl{}) {}
  DeviceHandle handle(uint64_t timeout_ns) {
    return DeviceHandle{ring.data(), control.get(), tickets, static_cast<uint32_t>(ring.size()), 0, timeout_ns};
  }
  std::vector<DeviceDescriptor> ring;
  std::unique_ptr<DeviceControl> control;
  unsigned long long tickets[8] = {};  // as the engine's 64 bytes
};

// Records every posted operation; completes them from its own thread (as a dmx worker would),
// after a random delay, with the outcome `fail_ticket_` asks for.
class FakePoster final : public Poster {
 public:
  FakePoster() : thread_([this] { run(); }) {}
  ~FakePoster() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void post(const DeviceDescriptor& d, std::function<void(const Status&)> done) override {
    std::lock_guard<std::mutex> lock(mu_);
    posted_.push_back(d);
    if (hold_) return;  // never completes: a peer that went silent
    queue_.push_back({d, std::move(done)});
    cv_.notify_all();
  }
  Status health() override {
    std::lock_guard<std::mutex> lock(mu_);
    return health_;
  }
  void set_health(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    health_ = std::move(s);
  }
  void fail_tag(uint64_t tag) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_tag_ = tag;
  }
  void hold() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = true;
  }
  std::vector<DeviceDescriptor> posted() {
    std::lock_guard<std::mutex> lock(mu_);
    return posted_;
  }

 private:
  void run() {
    std::mt19937 rng(std::random_device{}());
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return quit_ || !queue_.empty(); });
      if (quit_) return;
      auto [d, done] = std::move(queue_.front());
      queue_.pop_front();
      bool fail = d.tag == fail_tag_;
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 50));
      done(fail ? Status(Code::kTruncated, "the fake peer refused it") : Status());
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<DeviceDescriptor, std::function<void(const Status&)>>> queue_;
  std::vector<DeviceDescriptor> posted_;
  Status health_;
  uint64_t fail_tag_ = ~uint64_t{0};
  bool hold_ = false;
  bool quit_ = false;
  std::thread thread_;
};

Channel::Options options() {
  Channel::Options o;
  o.spin = 200us;
  o.health_every = 500us;
  o.peer = "fake peer";
  return o;
}

// Four "blocks" post 300 sends each through an 8-slot ring (so slots are reused many times) and
// wait for each; every descriptor arrives intact, each ticket once, and every wait succeeds.
TEST(DeviceChannel, ManyBlocksThroughASmallRing) {
  Memory mem(8);
  auto poster = std::make_shared<FakePoster>();
  Channel ch(mem.ring.data(), 8, mem.control.get(), poster, options());
  ch.start();
  DeviceHandle h = mem.handle(10'000'000'000ull);
  constexpr int kBlocks = 4, kEach = 300;
  std::random_device rd;
  const uint64_t salt = (uint64_t{rd()} << 32) | rd();
  std::vector<std::thread> blocks;
  std::atomic<int> bad{0};
  for (int b = 0; b < kBlocks; ++b) {
    blocks.emplace_back([&, b] {
      std::vector<unsigned char> src(64);
      for (int i = 0; i < kEach; ++i) {
        uint64_t tag = salt ^ (uint64_t(b) << 32 | uint64_t(i));
        ring::fence_system();
        int64_t t = ring::post(h, DeviceOpKind::kSend, 0, src.data() + (i % 64), 64 - (i % 64), tag, 0, 0, 0);
        if (t < 0 || ring::wait(h, static_cast<uint64_t>(t)) != kDeviceOk) ++bad;
      }
    });
  }
  for (auto& t : blocks) t.join();
  EXPECT_EQ(bad.load(), 0);
  auto posted = poster->posted();
  ASSERT_EQ(posted.size(), size_t{kBlocks * kEach});
  std::map<uint64_t, int> seen;
  for (size_t i = 0; i < posted.size(); ++i) {
    EXPECT_EQ(posted[i].seq, i + 1) << "taken in ticket order";
    EXPECT_EQ(posted[i].op, static_cast<uint32_t>(DeviceOpKind::kSend));
    uint64_t idx = (posted[i].tag ^ salt) & 0xffffffff;
    EXPECT_EQ(posted[i].length, 64 - (idx % 64));
    ++seen[posted[i].tag];
  }
  EXPECT_EQ(seen.size(), size_t{kBlocks * kEach});
  EXPECT_EQ(ring::load_acquire(&mem.control->completed), uint64_t{kBlocks * kEach});
  EXPECT_EQ(ring::error(h), 0);
  EXPECT_EQ(ch.stats().completed, uint64_t{kBlocks * kEach});
}

// A write's fields (remote key, size, offset, notify) reach the poster as the kernel wrote them.
TEST(DeviceChannel, WriteFieldsArriveIntact) {
  Memory mem(4);
  auto poster = std::make_shared<FakePoster>();
  Channel ch(mem.ring.data(), 4, mem.control.get(), poster, options());
  ch.start();
  DeviceHandle h = mem.handle(10'000'000'000ull);
  std::mt19937_64 rng(std::random_device{}());
  uint64_t key = rng(), size = rng() | 1, offset = rng() % size, value = rng();
  unsigned char byte = 7;
  int64_t t = ring::post(h, DeviceOpKind::kWrite, kDeviceNotify, &byte, 1, key, size, offset, value);
  ASSERT_GE(t, 0);
  ASSERT_EQ(ring::wait(h, static_cast<uint64_t>(t)), kDeviceOk);
  auto posted = poster->posted();
  ASSERT_EQ(posted.size(), 1u);
  EXPECT_EQ(posted[0].addr, reinterpret_cast<uint64_t>(&byte));
  EXPECT_EQ(posted[0].tag, key);
  EXPECT_EQ(posted[0].remote_size, size);
  EXPECT_EQ(posted[0].offset, offset);
  EXPECT_EQ(posted[0].notify_value, value);
  EXPECT_EQ(posted[0].flags, kDeviceNotify);
}

// An operation that fails: its wait returns its code, the ones before it succeed, and the handle
// refuses further posts (the error word is sticky).
TEST(DeviceChannel, AFailedOperationIsSticky) {
  Memory mem(8);
  auto poster = std::make_shared<FakePoster>();
  Channel ch(mem.ring.data(), 8, mem.control.get(), poster, options());
  ch.start();
  DeviceHandle h = mem.handle(10'000'000'000ull);
  poster->fail_tag(3);
  unsigned char b = 1;
  std::vector<int64_t> tickets;
  for (uint64_t tag = 0; tag < 4; ++tag) tickets.push_back(ring::post(h, DeviceOpKind::kSend, 0, &b, 1, tag, 0, 0, 0));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(ring::wait(h, static_cast<uint64_t>(tickets[i])), kDeviceOk) << i;
  EXPECT_EQ(ring::wait(h, static_cast<uint64_t>(tickets[3])), -static_cast<int>(Code::kTruncated));
  EXPECT_EQ(ring::error(h), static_cast<int>(Code::kTruncated));
  EXPECT_EQ(ring::post(h, DeviceOpKind::kSend, 0, &b, 1, 9, 0, 0, 0), -static_cast<int64_t>(Code::kTruncated));
}

// A bad descriptor (unknown op, flags on a send, a null source) fails its ticket with
// kInvalidArgument and is never posted.
TEST(DeviceChannel, BadDescriptorsAreRefused) {
  for (int which = 0; which < 3; ++which) {
    Memory mem(4);
    auto poster = std::make_shared<FakePoster>();
    Channel ch(mem.ring.data(), 4, mem.control.get(), poster, options());
    ch.start();
    DeviceHandle h = mem.handle(10'000'000'000ull);
    unsigned char b = 0;
    int64_t t = which == 0   ? ring::post(h, static_cast<DeviceOpKind>(77), 0, &b, 1, 0, 0, 0, 0)
                : which == 1 ? ring::post(h, DeviceOpKind::kSend, kDeviceNotify, &b, 1, 0, 0, 0, 0)
                             : ring::post(h, DeviceOpKind::kSend, 0, nullptr, 8, 0, 0, 0, 0);
    ASSERT_GE(t, 0);
    EXPECT_EQ(ring::wait(h, static_cast<uint64_t>(t)), -kDeviceInvalid) << which;
    EXPECT_TRUE(poster->posted().empty()) << which;
    EXPECT_EQ(ch.stats().invalid, 1u);
  }
}

// The peer dies with an operation in flight: the kernel's wait returns kPeerFailed (the health
// check found it), never hangs, well before the handle's own deadline.
TEST(DeviceChannel, DeadPeerEndsTheWait) {
  Memory mem(4);
  auto poster = std::make_shared<FakePoster>();
  poster->hold();
  Channel ch(mem.ring.data(), 4, mem.control.get(), poster, options());
  ch.start();
  DeviceHandle h = mem.handle(60'000'000'000ull);
  unsigned char b = 0;
  int64_t t = ring::post(h, DeviceOpKind::kSend, 0, &b, 1, 1, 0, 0, 0);
  ASSERT_GE(t, 0);
  std::thread killer([&] {
    std::this_thread::sleep_for(20ms);
    poster->set_health(Status(Code::kPeerFailed, "peer pid 4242 died"));
  });
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(ring::wait(h, static_cast<uint64_t>(t)), -kDevicePeerFailed);
  killer.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  EXPECT_EQ(ring::post(h, DeviceOpKind::kSend, 0, &b, 1, 2, 0, 0, 0), -kDevicePeerFailed);
}

// Nobody takes descriptors (no thread started): once the ring is full, a post gives up at the
// handle's deadline; a wait on a taken-but-never-completed ticket does too.
TEST(DeviceChannel, NoHostThreadMeansTimeoutNotHang) {
  Memory mem(2);
  auto poster = std::make_shared<FakePoster>();
  poster->hold();
  Channel ch(mem.ring.data(), 2, mem.control.get(), poster, options());
  DeviceHandle h = mem.handle(50'000'000ull);  // 50 ms
  unsigned char b = 0;
  EXPECT_GE(ring::post(h, DeviceOpKind::kSend, 0, &b, 1, 0, 0, 0, 0), 0);
  EXPECT_GE(ring::post(h, DeviceOpKind::kSend, 0, &b, 1, 1, 0, 0, 0), 0);
  EXPECT_EQ(ring::post(h, DeviceOpKind::kSend, 0, &b, 1, 2, 0, 0, 0), -kDeviceTimeout);
  EXPECT_EQ(ch.poll(), 2u);  // the host takes the two published ones; the held peer never completes
  EXPECT_EQ(ring::wait(h, 0), -kDeviceTimeout);
  ch.stop(Status(Code::kClosed, "closed"));
  EXPECT_EQ(ring::wait(h, 0), -kDeviceClosed);
}

// Notifications: the count and the latest value, in order; a wait past the count times out.
TEST(DeviceChannel, Notifications) {
  Memory mem(4);
  auto poster = std::make_shared<FakePoster>();
  Channel ch(mem.ring.data(), 4, mem.control.get(), poster, options());
  ch.start();
  DeviceHandle h = mem.handle(20'000'000ull);
  std::mt19937_64 rng(std::random_device{}());
  uint64_t v1 = rng(), v2 = rng();
  std::thread peer([&] {
    ch.notify(v1);
    std::this_thread::sleep_for(5ms);
    ch.notify(v2);
  });
  uint64_t value = 0;
  EXPECT_EQ(ring::wait_notifications(h, 2, &value), kDeviceOk);
  peer.join();
  EXPECT_EQ(value, v2);
  EXPECT_EQ(ring::wait_notifications(h, 3, &value), -kDeviceTimeout);
}

// Direct puts, played by host threads with the kernel's protocol code: a writer stores fresh bytes
// into the reader's "window" and publishes each round with signal_direct; the reader waits for the
// signal and must see exactly that round's bytes. The host is told of every put (kDirect: counted,
// never posted).
TEST(DeviceChannel, DirectPutsAreSeenAfterTheirSignal) {
  Memory mem(8);
  auto poster = std::make_shared<FakePoster>();
  Channel ch(mem.ring.data(), 8, mem.control.get(), poster, options());
  ch.start();
  DeviceHandle h = mem.handle(10'000'000'000ull);
  constexpr int kRounds = 200;
  constexpr uint64_t kLen = 61;
  std::vector<unsigned char> region(kRounds * kLen, 0xA5);
  alignas(8) uint64_t signal = 0;
  DeviceWindow data{reinterpret_cast<uint64_t>(region.data()), region.size()};
  DeviceWindow sig{reinterpret_cast<uint64_t>(&signal), sizeof signal};
  const uint64_t seed = std::random_device{}();
  auto byte = [&](int r, uint64_t i) { return static_cast<unsigned char>((seed * 31 + r * 131 + i * 7) >> 3); };
  std::thread writer([&] {
    std::vector<unsigned char> src(kLen);
    for (int r = 0; r < kRounds; ++r) {
      for (uint64_t i = 0; i < kLen; ++i) src[i] = byte(r, i);
      ASSERT_TRUE(ring::window_holds(data, r * kLen, kLen));
      std::memcpy(reinterpret_cast<void*>(data.base + r * kLen), src.data(), kLen);
      ring::fence_system();
      uint64_t* word = ring::signal_word(sig, 0);
      ASSERT_NE(word, nullptr);
      ASSERT_GE(ring::signal_direct(h, word, r + 1, src.data(), kLen), 0);
    }
  });
  int stale = 0;
  for (int r = 0; r < kRounds; ++r) {
    ASSERT_EQ(ring::wait_signal(h, &signal, r + 1, nullptr), kDeviceOk) << r;
    ring::fence_acquire_system();
    for (uint64_t i = 0; i < kLen; ++i) stale += region[r * kLen + i] != byte(r, i);
  }
  writer.join();
  EXPECT_EQ(stale, 0);
  for (int i = 0; i < 1000 && ch.stats().direct < kRounds; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(ch.stats().direct, uint64_t{kRounds});
  EXPECT_EQ(ch.stats().direct_bytes, uint64_t{kRounds} * kLen);
  EXPECT_TRUE(poster->posted().empty()) << "a direct put is counted, not posted";
  EXPECT_EQ(ring::error(h), 0);
}

// Windows refuse what is not inside them, overflow included; a signal word must be aligned.
TEST(DeviceChannel, DirectPutBoundsAreChecked) {
  alignas(8) unsigned char mem[64];
  DeviceWindow w{reinterpret_cast<uint64_t>(mem), sizeof mem};
  EXPECT_TRUE(ring::window_holds(w, 0, 64));
  EXPECT_TRUE(ring::window_holds(w, 64, 0));
  EXPECT_FALSE(ring::window_holds(w, 1, 64));
  EXPECT_FALSE(ring::window_holds(w, 65, 0));
  EXPECT_FALSE(ring::window_holds(w, ~uint64_t{0} - 2, 8));  // offset + length wraps
  EXPECT_FALSE(ring::window_holds(w, 8, ~uint64_t{0}));
  EXPECT_FALSE(ring::window_holds(DeviceWindow{}, 0, 0));
  EXPECT_NE(ring::signal_word(w, 56), nullptr);
  EXPECT_EQ(ring::signal_word(w, 60), nullptr);  // past the end
  EXPECT_EQ(ring::signal_word(w, 4), nullptr);   // unaligned
}

// A signal that never comes: the wait gives up at the handle's deadline; once the endpoint fails
// it returns the error word's code instead, long before its deadline.
TEST(DeviceChannel, WaitSignalEndsByDeadlineOrError) {
  Memory mem(4);
  auto poster = std::make_shared<FakePoster>();
  Channel ch(mem.ring.data(), 4, mem.control.get(), poster, options());
  ch.start();
  alignas(8) uint64_t signal = 3;
  EXPECT_EQ(ring::wait_signal(mem.handle(20'000'000ull), &signal, 4, nullptr), -kDeviceTimeout);
  uint64_t seen = 0;
  EXPECT_EQ(ring::wait_signal(mem.handle(20'000'000ull), &signal, 3, &seen), kDeviceOk);
  EXPECT_EQ(seen, 3u);
  DeviceHandle h = mem.handle(60'000'000'000ull);
  std::thread killer([&] {
    std::this_thread::sleep_for(20ms);
    poster->set_health(Status(Code::kPeerFailed, "peer pid 4242 died"));
  });
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(ring::wait_signal(h, &signal, 4, nullptr), -kDevicePeerFailed);
  killer.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
}

}  // namespace
}  // namespace dmx::device
