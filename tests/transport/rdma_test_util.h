// Helpers of the rdma tests that run over a verbs device (rdma_path_test.cc, rdma_list_test.cc,
// rdma_raw_peer_test.cc): their fixtures, a recorder of a path's events, two queue-pair
// connections joined.
#pragma once

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/config.h"
#include "test_env.h"
#include "transport/path.h"
#include "transport/rdma/device.h"
#include "transport/rdma/rdma_path.h"
#include "transport/rdma/setup.h"

namespace dmx::rdma {

constexpr unsigned char kPoison = 0xA5;

inline std::vector<unsigned char> fresh(size_t n) {
  static std::mt19937_64 rng(std::random_device{}());
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

// Records a path's events; wait() is bounded.
struct Recorder : PayloadPath::Events {
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, Status> tx, rx;
  std::optional<Status> failure;
  bool stopped = false;
  void on_path_tx_done(uint64_t seq, const Status& s) override {
    note([&] { tx[seq] = s; });
  }
  void on_path_rx_done(uint64_t seq, const Status& s) override {
    note([&] { rx[seq] = s; });
  }
  void on_path_failed(const Status& s) override {
    note([&] { failure = s; });
  }
  void on_path_stopped() override {
    note([&] { stopped = true; });
  }
  template <class F>
  void note(F f) {
    std::lock_guard l(mu);
    f();
    cv.notify_all();
  }
  template <class P>
  bool wait(P pred, std::chrono::seconds limit = test::kEventually) {
    std::unique_lock l(mu);
    return cv.wait_for(l, limit, [&] { return pred(*this); });
  }
};

// A payload path under test and what it reported.
struct Side {
  std::unique_ptr<PayloadPath> path;
  Recorder events;
};

// Two queue-pair connections joined over a socket pair (the data socket's stand-in), set up at
// once as two hosts would: `a` on a_fd, which knows its peer as a_peer, `b` likewise.
struct ConnectedPair {
  Result<std::unique_ptr<Connection>> a = Status(Code::kInternal, "not run");
  Result<std::unique_ptr<Connection>> b = Status(Code::kInternal, "not run");
  int a_fd = -1, b_fd = -1;
};
inline ConnectedPair connect_pair(const std::shared_ptr<Device>& dev, Depths a, const std::string& a_peer, Depths b,
                                  const std::string& b_peer, std::chrono::seconds limit,
                                  void (*a_hostile)(ConnInfo*) = nullptr) {
  ConnectedPair p;
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) {
    p.a = Status(Code::kInternal, "socketpair failed");
    p.b = Status(Code::kInternal, "socketpair failed");
    return p;
  }
  p.a_fd = fds[0];
  p.b_fd = fds[1];
  std::thread t([&] { p.a = connect_qps(dev, fds[0], a, a_peer, Deadline::after(limit), a_hostile); });
  p.b = connect_qps(dev, fds[1], b, b_peer, Deadline::after(limit));
  t.join();
  return p;
}

// A test over the verbs device: skipped with the reason where there is none (failed in
// scripts/rxe-vm.sh's guest, which sets DMX_RXE_GUEST and must have one).
class RdmaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = Config::resolve();
    ASSERT_TRUE(config.ok());
    auto d = open_device(*config);
    if (!d.ok() && std::getenv("DMX_RXE_GUEST")) FAIL() << "DMX_RXE_GUEST is set, but " << d.status().message();
    if (!d.ok()) DMX_SKIP(test::kNoRdma) << d.status().message();
    dev_ = *d;
  }
  // Stops the sides' paths, each waited for (bounded).
  static void stop(std::initializer_list<Side*> sides) {
    for (Side* s : sides)
      if (s->path) {
        s->path->stop();
        s->events.wait([](Recorder& r) { return r.stopped; });
      }
  }

  std::shared_ptr<Device> dev_;
};

struct Options {
  Depths a, b;  // a sends, b receives (each path can do both)
  void (*a_hostile)(ConnInfo*) = nullptr;
  const WriteTamper* a_tamper = nullptr;
};

// Two rdma paths of one process, `a_` sending and `b_` receiving, over the verbs device
// (rdma_path_test.cc, rdma_list_test.cc).
class RdmaPathTest : public RdmaDeviceTest {
 public:  // for the tests' helper functions too
  void TearDown() override { stop({&a_, &b_}); }

  void connect(Options o = {}) {
    ConnectedPair p = connect_pair(dev_, o.a, "side b", o.b, "side a", std::chrono::seconds(30), o.a_hostile);
    ASSERT_TRUE(p.a.ok()) << p.a.status().to_string();
    ASSERT_TRUE(p.b.ok()) << p.b.status().to_string();
    a_.path = make_rdma_path(setup(std::move(*p.a), p.a_fd, "side b", o.a_tamper));
    b_.path = make_rdma_path(setup(std::move(*p.b), p.b_fd, "side a", nullptr));
    a_.path->start(&a_.events, nullptr);
    b_.path->start(&b_.events, nullptr);
  }

  PathSetup setup(std::unique_ptr<Connection> c, int fd, std::string peer, const WriteTamper* tamper) {
    PathSetup s;
    s.device = dev_;
    s.regions = regions_;
    s.gpu = gpu_registration("off");
    s.connection = std::move(c);
    s.socket = UniqueFd(fd);
    s.peer = std::move(peer);
    s.tamper = tamper;
    return s;
  }

  // One chunk a -> b: src[3, 3+n) into dst[5, 5+n). Returns b's rx status.
  Status move(uint64_t seq, const std::vector<unsigned char>& src, std::vector<unsigned char>& dst, size_t n) {
    auto d = a_.path->post_tx(seq, MemRegion{const_cast<unsigned char*>(src.data()) + 3, n, {}}, true);
    if (!d.ok()) return d.status();
    auto len = b_.path->chunk_length(*d);
    if (!len.ok() || *len != n) return Status(Code::kInternal, "chunk_length");
    Status s = b_.path->post_rx(seq, *d, MemRegion{dst.data() + 5, n, {}});
    if (!s.ok()) return s;
    if (!b_.events.wait([&](Recorder& r) { return r.rx.count(seq) > 0; })) return Status(Code::kTimeout, "rx");
    std::lock_guard l(b_.events.mu);
    return b_.events.rx[seq];
  }

  // Connects with a sender whose WRITEs wait until the test sets hold_ to false (a write kept in
  // flight). Both outlive the paths (members: TearDown stops the paths first).
  void connect_holding() {
    hold_ = true;
    tamper_.hold = &hold_;
    Options o;
    o.a_tamper = &tamper_;
    connect(o);
  }


  std::shared_ptr<RegionTable> regions_ = std::make_shared<RegionTable>();
  std::atomic<bool> hold_{false};
  WriteTamper tamper_;  // the sender's, when a test gives it (outlives the paths)
  Side a_, b_;
};

inline bool lands(const std::vector<unsigned char>& src, const std::vector<unsigned char>& dst, size_t n) {
  return std::equal(src.begin() + 3, src.begin() + 3 + static_cast<ptrdiff_t>(n), dst.begin() + 5) &&
         dst[4] == kPoison && dst[5 + n] == kPoison;
}

// A sender that writes with a key or at an address the clear-to-send did not give is refused by
// the receiver's NIC: the sender's path fails naming the peer and the WRITE, the receiver's chunk
// and path fail (its queue pair is in error), and not a byte lands.
inline void expect_refused(Side& a, Side& b, const std::vector<unsigned char>& dst) {
  ASSERT_TRUE(a.events.wait([](Recorder& r) { return r.failure.has_value() && r.stopped; }));
  std::string why = a.events.failure->to_string();
  EXPECT_NE(why.find("side b"), std::string::npos) << why;
  EXPECT_NE(why.find("RDMA WRITE"), std::string::npos) << why;
  ASSERT_TRUE(b.events.wait([](Recorder& r) { return r.failure.has_value() && r.stopped; }));
  EXPECT_NE(b.events.failure->to_string().find("side a"), std::string::npos) << b.events.failure->to_string();
  ASSERT_FALSE(b.events.rx.empty());
  EXPECT_FALSE(b.events.rx.begin()->second.ok());
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](unsigned char c) { return c == kPoison; }))
      << "bytes landed from a refused write";
}

}  // namespace dmx::rdma
