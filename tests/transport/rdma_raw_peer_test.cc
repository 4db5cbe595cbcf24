// A raw verbs peer against dmx's rdma wire: one side is a dmx rdma path or control-stream conduit,
// the other a bare Connection (setup.h: queue pairs at RTS, receive slots posted) that posts
// whatever SENDs and WRITEs a test asks, bypassing every check dmx's own sender makes. Each
// hostile message gets a refusal that names the peer, and an endpoint beside it goes on. Also the
// conduit's own life: bytes in order through its credits, the end mark, a peer that dies.
// Needs a verbs device (soft-RoCE in scripts/rxe-vm.sh's guest); skips with the reason elsewhere.
#include <gtest/gtest.h>

#include "test_env.h"

#if DMX_HAVE_RDMA
#include <arpa/inet.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "rdma_test_util.h"
#include "stream/conduit.h"
#include "transport/rdma/control_conduit.h"
#include "transport/rdma/device.h"
#include "transport/rdma/rdma_path.h"
#include "transport/rdma/setup.h"
#include "transport/rdma/wire.h"

namespace dmx::rdma {
namespace {

using namespace std::chrono_literals;

constexpr const char* kRaw = "raw peer";

// The raw side: posts on its queue pairs what it is told and reaps its own completions.
struct RawPeer {
  std::unique_ptr<Connection> c;
  UniqueFd socket;
  uint32_t next_slot = 0;

  // A SEND with immediate data `imm` carrying `bytes` (≤ kSmallMax) on queue pair `qp`; waits for
  // its completion (bounded): false when the NIC says it failed or it did not complete.
  bool send(int qp, uint32_t imm, std::span<const unsigned char> bytes = {}) {
    uint32_t slot = next_slot++ % c->send_slots;
    std::memcpy(c->send_slot(slot), bytes.data(), bytes.size());
    ibv_sge sge{reinterpret_cast<uintptr_t>(c->send_slot(slot)), static_cast<uint32_t>(bytes.size()),
                c->slots_mr->lkey()};
    return post(qp, IBV_WR_SEND_WITH_IMM, imm, bytes.empty() ? nullptr : &sge, 0, 0);
  }
  // An RDMA WRITE with immediate data of `bytes` (registered by the caller: `lkey`) at addr/rkey.
  bool write(int qp, uint32_t imm, ibv_sge* sge, uint64_t addr, uint32_t rkey) {
    return post(qp, IBV_WR_RDMA_WRITE_WITH_IMM, imm, sge, addr, rkey);
  }
  // The next message the dmx side sent us (a receive completion), bounded.
  std::optional<ibv_wc> receive(std::chrono::seconds limit = test::kEventually) {
    auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      ibv_wc wc{};
      if (ibv_poll_cq(c->cq, 1, &wc) == 1) {
        if ((wc.wr_id >> 56) == 0) return wc;
        continue;  // a send of ours
      }
      std::this_thread::sleep_for(100us);
    }
    return std::nullopt;
  }

 private:
  bool post(int qp, ibv_wr_opcode op, uint32_t imm, ibv_sge* sge, uint64_t addr, uint32_t rkey) {
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = uint64_t{1} << 56;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(imm);
    wr.sg_list = sge;
    wr.num_sge = sge ? 1 : 0;
    wr.wr.rdma.remote_addr = addr;
    wr.wr.rdma.rkey = rkey;
    if (ibv_post_send(c->qps[static_cast<size_t>(qp)], &wr, &bad) != 0) return false;
    auto until = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < until) {
      ibv_wc wc{};
      if (ibv_poll_cq(c->cq, 1, &wc) == 1) {
        if ((wc.wr_id >> 56) == 0) {
          stash.push_back(wc);
          continue;
        }
        return wc.status == IBV_WC_SUCCESS;
      }
      std::this_thread::sleep_for(100us);
    }
    return false;
  }

 public:
  std::vector<ibv_wc> stash;  // receives seen while waiting for a send
};

class RdmaRawPeer : public RdmaDeviceTest {
 protected:
  void TearDown() override { stop({&dmx_, &other_a_, &other_b_}); }

  // Connects `raw` to a dmx side made by `make` on the other end of a socket pair.
  template <class Make>
  void pair(Depths dmx_depths, Depths raw_depths, Make make) {
    ConnectedPair p = connect_pair(dev_, dmx_depths, kRaw, raw_depths, "dmx side", 60s);
    ASSERT_TRUE(p.b.ok()) << p.b.status().to_string();
    ASSERT_TRUE(p.a.ok()) << p.a.status().to_string();
    raw_.c = std::move(*p.b);
    raw_.socket = UniqueFd(p.b_fd);
    make(std::move(*p.a), UniqueFd(p.a_fd));
  }

  void path_and_raw() {
    pair(Depths{}, Depths{},
         [&](std::unique_ptr<Connection> c, UniqueFd fd) { dmx_.path = make_path(std::move(c), std::move(fd), kRaw); });
    dmx_.path->start(&dmx_.events, nullptr);
  }

  std::unique_ptr<PayloadPath> make_path(std::unique_ptr<Connection> c, UniqueFd fd, std::string peer) {
    PathSetup s;
    s.device = dev_;
    s.gpu = gpu_registration("off");
    s.connection = std::move(c);
    s.socket = std::move(fd);
    s.peer = std::move(peer);
    return make_rdma_path(std::move(s));
  }

  // The refusal: the dmx path failed, naming the raw peer and saying `what`.
  void refused(const std::string& what) {
    ASSERT_TRUE(dmx_.events.wait([](Recorder& r) { return r.failure.has_value(); }, 60s)) << "no refusal";
    std::string why = dmx_.events.failure->to_string();
    EXPECT_EQ(dmx_.events.failure->code(), Code::kProtocol) << why;
    EXPECT_NE(why.find(what), std::string::npos) << why;
    EXPECT_NE(why.find(kRaw), std::string::npos) << why;
  }

  // Another endpoint's path of this process goes on: a large and a small chunk land byte-exact.
  void others_go_on() {
    ConnectedPair p = connect_pair(dev_, Depths{}, "other b", Depths{}, "other a", 60s);
    ASSERT_TRUE(p.a.ok() && p.b.ok());
    other_a_.path = make_path(std::move(*p.a), UniqueFd(p.a_fd), "other b");
    other_b_.path = make_path(std::move(*p.b), UniqueFd(p.b_fd), "other a");
    other_a_.path->start(&other_a_.events, nullptr);
    other_b_.path->start(&other_b_.events, nullptr);
    for (size_t n : {size_t{100 << 10}, size_t{100}}) {
      auto src = fresh(n);
      std::vector<unsigned char> dst(n);
      auto d = other_a_.path->post_tx(n, MemRegion{src.data(), n, {}}, true);
      ASSERT_TRUE(d.ok()) << d.status().to_string();
      ASSERT_TRUE(other_b_.path->post_rx(n, *d, MemRegion{dst.data(), n, {}}).ok());
      ASSERT_TRUE(other_b_.events.wait([&](Recorder& r) { return r.rx.count(n) > 0; }));
      ASSERT_TRUE(other_b_.events.rx[n].ok()) << other_b_.events.rx[n].to_string();
      EXPECT_EQ(dst, src);
    }
  }

  void write_outside(bool other_key);

  RawPeer raw_;
  Side dmx_, other_a_, other_b_;
};

uint32_t msg(QpMessage kind, uint32_t value) {
  return kind << 24 | value;
}

TEST_F(RdmaRawPeer, ClearToSendForATokenNotInFlightIsRefused) {
  path_and_raw();
  std::vector<unsigned char> cts = Cts{0x1000, 0x1234, false}.encode();
  raw_.send(0, msg(kMsgCts, 777), cts);
  refused("clear-to-send for chunk token 777");
  others_go_on();
}

TEST_F(RdmaRawPeer, ImmediateOfAWriteForATokenNotInFlightIsRefused) {
  path_and_raw();
  raw_.write(1, 4242, nullptr, 0, 0);  // zero bytes: the immediate data alone, the landed notice
  refused("wrote chunk token 0x1092, which is not in flight");
  others_go_on();
}

TEST_F(RdmaRawPeer, DoneForATokenNotInFlightIsRefused) {
  path_and_raw();
  raw_.send(2, msg(kMsgDone, 55));
  refused("released small chunk token 55, which is not in flight");
  others_go_on();
}

TEST_F(RdmaRawPeer, MessageOfAnUnknownKindIsRefused) {
  path_and_raw();
  raw_.send(0, msg(static_cast<QpMessage>(0x77), 1));
  refused("message kind 119");
  others_go_on();
}

// Small chunks past the credits the dmx side granted (and never their headers): at most its
// credits are held, then the peer is refused by name.
TEST_F(RdmaRawPeer, FloodOfSmallSendsIsRefused) {
  path_and_raw();
  auto bytes = fresh(64);
  const int credits = raw_.c->theirs.credits;
  for (int i = 1; i <= 4 * credits && !dmx_.events.wait([](Recorder& r) { return r.failure.has_value(); }, 0s); ++i)
    if (!raw_.send(0, msg(kMsgSmall, static_cast<uint32_t>(i)), bytes)) break;
  refused(fmt::format("than its {} credits (a flood)", credits));
  EXPECT_EQ(dmx_.path->stats().chunks_received, 0u);
  others_go_on();
}

void RdmaRawPeer::write_outside(bool other_key) {
  path_and_raw();
  constexpr size_t n = 8192;
  std::vector<unsigned char> dst(n + 4096, kPoison);
  ChunkDescriptor d{n, 9, false};
  ASSERT_TRUE(dmx_.path->post_rx(1, d.encode(), MemRegion{dst.data(), n, {}}).ok());
  auto wc = raw_.receive();
  ASSERT_TRUE(wc.has_value()) << "no clear-to-send";
  ASSERT_EQ(ntohl(wc->imm_data), msg(kMsgCts, 9));
  const unsigned char* body = raw_.c->recv_slot(static_cast<int>(wc->wr_id >> 32), static_cast<uint32_t>(wc->wr_id));
  auto cts = Cts::decode({body, Cts::kSize}, n, kRaw);
  ASSERT_TRUE(cts.ok()) << cts.status().to_string();
  auto src = fresh(n);
  ibv_mr* mr = ibv_reg_mr(raw_.c->pd->get(), src.data(), n, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ibv_sge sge{reinterpret_cast<uintptr_t>(src.data()), static_cast<uint32_t>(n), mr->lkey};
  bool ok = other_key ? raw_.write(0, 9, &sge, cts->addr, cts->rkey ^ 0x80)
                      : raw_.write(0, 9, &sge, cts->addr + 1, cts->rkey);
  ibv_dereg_mr(mr);
  EXPECT_FALSE(ok) << "the NIC took a WRITE outside the window";
  ASSERT_TRUE(dmx_.events.wait([](Recorder& r) { return r.failure.has_value() && r.rx.count(1) > 0; }, 60s));
  EXPECT_FALSE(dmx_.events.rx[1].ok());
  EXPECT_NE(dmx_.events.failure->to_string().find(kRaw), std::string::npos) << dmx_.events.failure->to_string();
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](unsigned char c) { return c == kPoison; }));
  others_go_on();
}

// The dmx side receives a chunk (its header as the raw peer would send it): the raw peer reads the
// clear-to-send and WRITEs one byte past the window it names, or with another rkey. The NIC
// refuses it; not a byte lands; the dmx side fails naming the peer.
TEST_F(RdmaRawPeer, WritePastTheWindowIsRefused) {
  write_outside(false);
}
TEST_F(RdmaRawPeer, WriteWithAnotherRkeyIsRefused) {
  write_outside(true);
}

// ---- the control stream's conduit ----

class RdmaControl : public RdmaRawPeer {
 protected:
  void conduit_and_raw() {
    pair(control_depths(), control_depths(), [&](std::unique_ptr<Connection> c, UniqueFd fd) {
      conduit_ = make_control_conduit(std::move(c), std::move(fd), kRaw);
    });
  }
  // Polls the conduit as its stream's worker would (reading a little at a time), until it fails.
  Status until_refused() {
    auto until = std::chrono::steady_clock::now() + 60s;
    while (std::chrono::steady_clock::now() < until) {
      auto r = conduit_->write({});
      if (!r.ok()) return r.status();
      std::this_thread::sleep_for(1ms);
    }
    return Status(Code::kTimeout, "not refused");
  }
  std::unique_ptr<stream::Conduit> conduit_;
};

// Two conduits: 1 MiB of fresh bytes in writes of odd sizes arrive in order, byte-exact, through
// the credits (the reader lags, the writer waits), and the end mark comes after the last byte.
TEST_F(RdmaControl, BytesArriveInOrderThroughTheCreditsThenTheEnd) {
  std::unique_ptr<stream::Conduit> a, b;
  ConnectedPair p = connect_pair(dev_, control_depths(), "b", control_depths(), "a", 60s);
  ASSERT_TRUE(p.a.ok() && p.b.ok());
  a = make_control_conduit(std::move(*p.a), UniqueFd(p.a_fd), "b");
  b = make_control_conduit(std::move(*p.b), UniqueFd(p.b_fd), "a");
  const auto src = fresh(1 << 20);
  std::vector<unsigned char> got;
  Status wrote;
  std::thread writer([&] {
    size_t off = 0, step = 1;
    auto until = std::chrono::steady_clock::now() + 120s;
    while (off < src.size() && std::chrono::steady_clock::now() < until) {
      size_t n = std::min(src.size() - off, step);
      iovec iov[2] = {{const_cast<unsigned char*>(src.data()) + off, n / 2},
                      {const_cast<unsigned char*>(src.data()) + off + n / 2, n - n / 2}};
      auto k = a->write(iov);
      if (!k.ok()) {
        wrote = k.status();
        return;
      }
      off += *k;
      step = step * 7 % 9001 + 1;
      if (*k == 0) std::this_thread::sleep_for(50us);
    }
    a->shutdown();
  });
  Status end;
  auto until = std::chrono::steady_clock::now() + 120s;
  std::vector<unsigned char> buf(3000);
  while (std::chrono::steady_clock::now() < until) {
    auto k = b->read(buf.data(), 1 + got.size() % buf.size());
    if (!k.ok()) {
      end = k.status();
      break;
    }
    got.insert(got.end(), buf.begin(), buf.begin() + static_cast<ptrdiff_t>(*k));
    if (*k == 0) std::this_thread::sleep_for(50us);
  }
  writer.join();
  EXPECT_TRUE(wrote.ok()) << wrote.to_string();
  EXPECT_EQ(end.code(), Code::kPeerFailed) << end.to_string();
  EXPECT_NE(end.to_string().find("ended the control stream"), std::string::npos) << end.to_string();
  ASSERT_EQ(got.size(), src.size());
  EXPECT_TRUE(got == src);
  EXPECT_GT(a->acked_bytes(), 0u);
}

TEST_F(RdmaControl, FloodPastTheCreditsIsRefused) {
  conduit_and_raw();
  auto bytes = fresh(10);
  const int credits = raw_.c->theirs.credits;
  for (int i = 0; i <= credits; ++i) ASSERT_TRUE(raw_.send(0, msg(kMsgData, 0), bytes)) << i;
  Status s = until_refused();
  EXPECT_EQ(s.code(), Code::kProtocol) << s.to_string();
  EXPECT_NE(s.to_string().find(fmt::format("more messages than its {} credits (a flood)", credits)), std::string::npos)
      << s.to_string();
  EXPECT_NE(s.to_string().find(kRaw), std::string::npos) << s.to_string();
  others_go_on();
}

TEST_F(RdmaControl, CreditsNeverLentAreRefused) {
  conduit_and_raw();
  ASSERT_TRUE(raw_.send(0, msg(kMsgCredit, 1000)));
  Status s = until_refused();
  EXPECT_EQ(s.code(), Code::kProtocol) << s.to_string();
  EXPECT_NE(s.to_string().find("more than were lent"), std::string::npos) << s.to_string();
  EXPECT_NE(s.to_string().find(kRaw), std::string::npos) << s.to_string();
}

// Credit messages that give back nothing are not bounded by any credit: refused at the first.
TEST_F(RdmaControl, EmptyCreditMessageIsRefused) {
  conduit_and_raw();
  ASSERT_TRUE(raw_.send(0, msg(kMsgCredit, 0)));
  Status s = until_refused();
  EXPECT_EQ(s.code(), Code::kProtocol) << s.to_string();
  EXPECT_NE(s.to_string().find("gives back none"), std::string::npos) << s.to_string();
}

TEST_F(RdmaControl, WriteIntoTheQueuePairIsRefused) {
  conduit_and_raw();
  raw_.write(0, 1, nullptr, 0, 0);
  Status s = until_refused();
  EXPECT_NE(s.to_string().find("wrote into the control queue pair"), std::string::npos) << s.to_string();
}

// The peer dies (its queue pair and socket go, no end mark): what it sent is read, then kPeerFailed.
TEST_F(RdmaControl, PeerThatDiesIsSeenAfterItsBytes) {
  conduit_and_raw();
  auto bytes = fresh(100);
  ASSERT_TRUE(raw_.send(0, msg(kMsgData, 0), bytes));
  raw_.c.reset();
  raw_.socket = UniqueFd();
  std::vector<unsigned char> got;
  Status end;
  auto until = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < until) {
    unsigned char b[64];
    auto k = conduit_->read(b, sizeof b);
    if (!k.ok()) {
      end = k.status();
      break;
    }
    got.insert(got.end(), b, b + *k);
    if (*k == 0) {  // as the worker: sleep on what prepare_sleep names
      pollfd fds[3];
      int n = conduit_->prepare_sleep(false, fds);
      if (n > 0) ::poll(fds, static_cast<nfds_t>(n), 100);
      conduit_->after_sleep();
    }
  }
  EXPECT_EQ(got, bytes);
  EXPECT_EQ(end.code(), Code::kPeerFailed) << end.to_string();
  EXPECT_NE(end.to_string().find(kRaw), std::string::npos) << end.to_string();
}

}  // namespace
}  // namespace dmx::rdma

#else
TEST(RdmaRawPeer, NotBuilt) {
  DMX_SKIP(dmx::test::kNotBuilt) << "dmx was built without libibverbs (DMX_ENABLE_RDMA)";
}
#endif
