// libnccl-net-dmx.so driven as NCCL's proxy drives a net plugin, through both exported versions
// (v10 and v11), both ends in this process (plugin_process_test.cc: against a peer process).
#include "tests/nccl/plugin_fixture.h"

namespace dmx::nccl::test {
namespace {

TEST_P(Nccl, ExportsTheVersionAndDescribesItsDevices) {
  if (api_.v11) {
    EXPECT_STREQ(api_.v11->name, "dmx");
    EXPECT_NE(api_.v11->finalize, nullptr);
    EXPECT_NE(api_.v11->set_net_attr, nullptr);
    NetAttr attr{{-1, -1, -1, -1}, {-1, -1, -1, -1}, 0, 0, 0};
    EXPECT_EQ(api_.v11->set_net_attr(api_.ctx, &attr), kSuccess);
  } else {
    EXPECT_STREQ(api_.v10->name, "dmx");
  }
  int n = 0;
  ASSERT_EQ(api_.devices(&n), kSuccess);
  ASSERT_GE(n, 1);
  PropertiesV11 p;
  ASSERT_EQ(api_.properties(0, &p), kSuccess);
  ASSERT_NE(p.name, nullptr);
  EXPECT_STREQ(p.name, "lo");  // DMX_NCCL_IFNAME==lo in these tests
  EXPECT_EQ(p.pci_path, nullptr) << "lo is virtual";
  EXPECT_GT(p.speed, 0);
  EXPECT_GT(p.latency, 0.f);
  EXPECT_GE(p.max_comms, 64);
  EXPECT_EQ(p.max_recvs, 8);
  EXPECT_TRUE(p.ptr_support & kPtrHost);
  EXPECT_EQ(p.ptr_support & kPtrCuda, mem_available(MemSpec{MemKind::kCuda, 0}).ok() ? kPtrCuda : 0);
  EXPECT_EQ(p.net_device_type, kDeviceHost);
  EXPECT_EQ(p.v_props.ndevs, 1);
  EXPECT_EQ(p.v_props.devs[0], 0);
  EXPECT_EQ(p.max_p2p_bytes, size_t(1) << 30);
  EXPECT_EQ(p.max_multi_request_size, GetParam() == 11 ? 1 : 0) << "v10 has no such field: left as the harness zeroed it";
  EXPECT_EQ(api_.properties(n, &p), kInternalError);
  VDeviceProps one{1, {0, 0, 0, 0}}, two{2, {0, 0, 0, 0}};
  int d = -1;
  auto make = api_.v11 ? api_.v11->make_v_device : api_.v10->make_v_device;
  EXPECT_EQ(make(&d, &one), kSuccess);
  EXPECT_EQ(d, 0);
  EXPECT_EQ(make(&d, &two), kInvalidUsage);
  EXPECT_TRUE(logged("device 0: lo")) << "init lists the devices through NCCL's logger";
  if (std::getenv("NCCL_MIN_NCHANNELS") == nullptr && std::getenv("NCCL_NCHANNELS_PER_NET_PEER") == nullptr) {
    EXPECT_TRUE(logged("suggested settings not set: NCCL_MIN_NCHANNELS=8 NCCL_NCHANNELS_PER_NET_PEER=8"))
        << "init names the NCCL settings under which the plugin moved most";
  }
  // NCCL calls irecvConsumed after every receive when it is set (seen with NCCL 2.28), whatever the
  // device type: a host-only plugin leaves both device-offload hooks null, as NCCL's own do.
  EXPECT_EQ(api_.v11 ? (void*)api_.v11->irecv_consumed : (void*)api_.v10->irecv_consumed, nullptr);
  EXPECT_EQ(api_.v11 ? (void*)api_.v11->get_device_mr : (void*)api_.v10->get_device_mr, nullptr);
}

TEST_P(Nccl, RefusesHandlesItDidNotMake) {
  unsigned char h[kHandleMaxSize] = {};
  void* sc = reinterpret_cast<void*>(1);
  EXPECT_EQ(api_.connect(0, h, &sc), kInternalError);
  EXPECT_EQ(sc, nullptr);
  void* lc = nullptr;
  ASSERT_EQ(api_.listen(0, h, &lc), kSuccess);
  unsigned char bad[kHandleMaxSize];
  std::memcpy(bad, h, sizeof bad);
  std::memset(bad + 24, 'a', kHandleMaxSize - 24);  // an address with no end
  EXPECT_EQ(api_.connect(0, bad, &sc), kInternalError);
  std::memcpy(bad, h, sizeof bad);
  bad[16] = 0x77;  // a connection job nobody started
  EXPECT_EQ(api_.connect(0, bad, &sc), kInternalError);
  EXPECT_EQ(api_.connect(7, h, &sc), kInternalError) << "no such device";
  EXPECT_EQ(api_.close_listen(lc), kSuccess);
}

TEST_P(Nccl, ConnectAndAcceptReturnAtOnceUntilReady) {
  unsigned char h[kHandleMaxSize] = {};
  void *lc = nullptr, *sc = nullptr, *rc = nullptr;
  ASSERT_EQ(api_.listen(0, h, &lc), kSuccess);
  auto t0 = Clock::now();
  ASSERT_EQ(api_.accept(lc, &rc), kSuccess);
  EXPECT_EQ(rc, nullptr) << "nobody connected yet";
  ASSERT_EQ(api_.connect(0, h, &sc), kSuccess);
  EXPECT_EQ(sc, nullptr) << "the first call only starts the connection";
  EXPECT_LT(since(t0), 1.0) << "neither call may block";  // blocking, accept would wait for ever
  int calls = 0;
  while ((sc == nullptr || rc == nullptr) && since(t0) < 20) {
    if (sc == nullptr) {
      ASSERT_EQ(api_.connect(0, h, &sc), kSuccess);
    }
    if (rc == nullptr) {
      ASSERT_EQ(api_.accept(lc, &rc), kSuccess);
    }
    ++calls;
    std::this_thread::sleep_for(100us);
  }
  ASSERT_NE(sc, nullptr);
  ASSERT_NE(rc, nullptr);
  EXPECT_GT(calls, 1);
  // One zero-byte message and one odd one, through the pair just made.
  std::vector<unsigned char> src(4099), dst(5000, 0);
  std::mt19937 gen(std::random_device{}());
  for (auto& b : src) b = static_cast<unsigned char>(gen());
  void *smh = nullptr, *rmh = nullptr;
  ASSERT_EQ(api_.reg_mr(sc, src.data(), src.size(), kPtrHost, &smh), kSuccess);
  ASSERT_EQ(api_.reg_mr(rc, dst.data(), dst.size(), kPtrHost, &rmh), kSuccess);
  for (size_t size : {size_t(0), src.size()}) {
    void *sr = nullptr, *rr = nullptr;
    void* d[1] = {dst.data()};
    size_t sz[1] = {dst.size()};
    int tg[1] = {3};
    void* mh[1] = {rmh};
    ASSERT_EQ(api_.irecv(rc, 1, d, sz, tg, mh, &rr), kSuccess);
    ASSERT_EQ(api_.isend(sc, src.data(), size, 3, smh, &sr), kSuccess);
    int rs[1] = {-1}, ss[1] = {-1};
    EXPECT_EQ(wait(rr, rs), kSuccess);
    EXPECT_EQ(wait(sr, ss), kSuccess);
    EXPECT_EQ(rs[0], static_cast<int>(size));
    EXPECT_EQ(ss[0], static_cast<int>(size));
  }
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), src.size()), 0);
  EXPECT_EQ(api_.dereg_mr(sc, smh), kSuccess);
  EXPECT_EQ(api_.dereg_mr(rc, rmh), kSuccess);
  EXPECT_EQ(api_.close_send(sc), kSuccess);
  EXPECT_EQ(api_.close_recv(rc), kSuccess);
  EXPECT_EQ(api_.close_listen(lc), kSuccess);
}

TEST_P(Nccl, RequestsPastTheMaximumFailCleanlyAndCloseEndsTheRest) {
  void *sc = nullptr, *rc = nullptr;
  pair(&sc, &rc);
  std::vector<unsigned char> rbuf(32 * 1024), sbuf(64 * 1024, 0x5a);
  void *rmh = nullptr, *smh = nullptr;
  ASSERT_EQ(api_.reg_mr(rc, rbuf.data(), rbuf.size(), kPtrHost, &rmh), kSuccess);
  ASSERT_EQ(api_.reg_mr(sc, sbuf.data(), sbuf.size(), kPtrHost, &smh), kSuccess);
  for (int i = 0; i <= kMaxRequests; ++i) {
    void* d[1] = {rbuf.data() + i % 32 * 1024};
    size_t sz[1] = {1024};
    int tg[1] = {1};
    void* mh[1] = {rmh};
    void* req = nullptr;
    NcclResult r = api_.irecv(rc, 1, d, sz, tg, mh, &req);
    if (i < kMaxRequests) {
      ASSERT_EQ(r, kSuccess) << i;
      ASSERT_NE(req, nullptr);
    } else {
      EXPECT_EQ(r, kInternalError) << "irecv number 33";
      EXPECT_EQ(req, nullptr);
    }
  }
  void* freq = nullptr;
  for (int i = 0; i < kMaxRequests; ++i) ASSERT_EQ(api_.iflush(rc, 1, nullptr, nullptr, nullptr, &freq), kSuccess);
  EXPECT_EQ(api_.iflush(rc, 1, nullptr, nullptr, nullptr, &freq), kInternalError);
  // Rendezvous sends under another tag: no receive matches them, so they stay in flight.
  for (int i = 0; i <= kMaxRequests * 8; ++i) {
    void* req = nullptr;
    NcclResult r = api_.isend(sc, sbuf.data(), sbuf.size(), 2, smh, &req);
    if (i < kMaxRequests * 8) ASSERT_EQ(r, kSuccess) << i;
    else EXPECT_EQ(r, kInternalError) << "isend number 257";
  }
  EXPECT_TRUE(logged("requests in flight"));
  EXPECT_EQ(api_.dereg_mr(sc, smh), kSuccess);
  EXPECT_EQ(api_.dereg_mr(rc, rmh), kSuccess);
  // Closing with everything in flight: bounded, and fine.
  auto t0 = Clock::now();
  EXPECT_EQ(api_.close_send(sc), kSuccess);
  EXPECT_EQ(api_.close_recv(rc), kSuccess);
  EXPECT_LT(since(t0), 10);
}

TEST_P(Nccl, ReceiveSmallerThanTheMessageFailsBothSides) {
  void *sc = nullptr, *rc = nullptr;
  pair(&sc, &rc);
  std::vector<unsigned char> src(100000, 1), dst(99999);
  void *smh = nullptr, *rmh = nullptr;
  ASSERT_EQ(api_.reg_mr(sc, src.data(), src.size(), kPtrHost, &smh), kSuccess);
  ASSERT_EQ(api_.reg_mr(rc, dst.data(), dst.size(), kPtrHost, &rmh), kSuccess);
  void *sr = nullptr, *rr = nullptr;
  void* d[1] = {dst.data()};
  size_t sz[1] = {dst.size()};
  int tg[1] = {0};
  void* mh[1] = {rmh};
  ASSERT_EQ(api_.irecv(rc, 1, d, sz, tg, mh, &rr), kSuccess);
  ASSERT_EQ(api_.isend(sc, src.data(), src.size(), 0, smh, &sr), kSuccess);
  EXPECT_EQ(wait(rr), kInvalidUsage);
  int s = wait(sr);
  EXPECT_NE(s, kSuccess);
  EXPECT_LT(s, 100) << "the sender's request must complete, not hang";
  // A send outside its registration is refused before anything moves.
  void* req = nullptr;
  EXPECT_EQ(api_.isend(sc, src.data() + 1, src.size(), 0, smh, &req), kInternalError);
  EXPECT_EQ(api_.dereg_mr(sc, smh), kSuccess);  // as NCCL does: deregister, then close
  EXPECT_EQ(api_.dereg_mr(rc, rmh), kSuccess);
  EXPECT_EQ(api_.close_send(sc), kSuccess);
  EXPECT_EQ(api_.close_recv(rc), kSuccess);
}

TEST_P(Nccl, ClosesInEveryState) {
  unsigned char h[kHandleMaxSize] = {};
  void* lc = nullptr;
  // A listen comm nobody connected to.
  ASSERT_EQ(api_.listen(0, h, &lc), kSuccess);
  EXPECT_EQ(api_.close_listen(lc), kSuccess);
  // A listen comm closed while a connect is in progress: the connect ends either way, in time.
  ASSERT_EQ(api_.listen(0, h, &lc), kSuccess);
  void* sc = nullptr;
  ASSERT_EQ(api_.connect(0, h, &sc), kSuccess);
  EXPECT_EQ(api_.close_listen(lc), kSuccess);
  auto t0 = Clock::now();
  NcclResult r = connect_until(api_, 0, h, &sc, 30);
  EXPECT_LT(since(t0), 25);
  if (r == kSuccess) {
    ASSERT_NE(sc, nullptr);
    EXPECT_EQ(api_.close_send(sc), kSuccess);
  }
  // A receive comm closed with a receive in flight; the sender's request then fails in time.
  void* rc = nullptr;
  pair(&sc, &rc);
  std::vector<unsigned char> buf(1 << 20);
  void *smh = nullptr, *rmh = nullptr;
  ASSERT_EQ(api_.reg_mr(sc, buf.data(), buf.size(), kPtrHost, &smh), kSuccess);
  ASSERT_EQ(api_.reg_mr(rc, buf.data(), buf.size(), kPtrHost, &rmh), kSuccess);
  void *sr = nullptr, *rr = nullptr;
  void* d[1] = {buf.data()};
  size_t sz[1] = {buf.size()};
  int tg[1] = {9};
  void* mh[1] = {rmh};
  ASSERT_EQ(api_.irecv(rc, 1, d, sz, tg, mh, &rr), kSuccess);
  ASSERT_EQ(api_.isend(sc, buf.data(), buf.size(), 8, smh, &sr), kSuccess);  // tag 8: matches nothing
  EXPECT_EQ(api_.dereg_mr(rc, rmh), kSuccess);
  EXPECT_EQ(api_.close_recv(rc), kSuccess);
  int s = wait(sr, nullptr, 15);
  EXPECT_NE(s, kSuccess);
  EXPECT_LT(s, 100) << "a send to a closed comm must fail, not hang";
  EXPECT_EQ(api_.dereg_mr(sc, smh), kSuccess);
  EXPECT_EQ(api_.close_send(sc), kSuccess);
}

TEST_P(Nccl, TakesOnlyTheConnectionThatBringsItsHandle) {
  unsigned char h[kHandleMaxSize] = {};
  void* lc = nullptr;
  ASSERT_EQ(api_.listen(0, h, &lc), kSuccess);
  unsigned char other[kHandleMaxSize];
  std::memcpy(other, h, sizeof other);
  other[8] ^= 0xff;  // another nonce, same address
  void *stray = nullptr, *rc = nullptr;
  ASSERT_EQ(connect_until(api_, 0, other, &stray), kSuccess);
  auto t0 = Clock::now();
  while (since(t0) < 0.3) {
    ASSERT_EQ(api_.accept(lc, &rc), kSuccess);
    ASSERT_EQ(rc, nullptr) << "a connection with another nonce was taken";
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_TRUE(logged("did not present this handle"));
  void* sc = nullptr;
  ASSERT_EQ(connect_until(api_, 0, h, &sc), kSuccess);
  ASSERT_EQ(accept_until(api_, lc, &rc), kSuccess);
  EXPECT_EQ(api_.close_send(stray), kSuccess);
  EXPECT_EQ(api_.close_send(sc), kSuccess);
  EXPECT_EQ(api_.close_recv(rc), kSuccess);
  EXPECT_EQ(api_.close_listen(lc), kSuccess);
}

// A handle's stage names its own connect job only: another handle that carries a copy of that stage
// (or guesses one) is refused, and the job stays with its handle.
TEST_P(Nccl, AHandleTakesOnlyItsOwnConnectJob) {
  unsigned char a[kHandleMaxSize] = {}, b[kHandleMaxSize] = {};
  void *la = nullptr, *lb = nullptr;
  ASSERT_EQ(api_.listen(0, a, &la), kSuccess);
  ASSERT_EQ(api_.listen(0, b, &lb), kSuccess);
  void* sc = nullptr;
  ASSERT_EQ(api_.connect(0, a, &sc), kSuccess);  // starts a's job; its token is in a's stage
  ASSERT_EQ(sc, nullptr);
  uint64_t stage = 0;
  std::memcpy(&stage, a + 16, sizeof stage);
  ASSERT_NE(stage, 0u);
  // b's handle with stages near a's, and small ones (sequential ids were guessable).
  for (uint64_t guess : {stage - 1, stage + 1, uint64_t{1}, uint64_t{2}, uint64_t{3}}) {
    unsigned char g[kHandleMaxSize];
    std::memcpy(g, b, sizeof g);
    std::memcpy(g + 16, &guess, sizeof guess);
    void* got = nullptr;
    EXPECT_EQ(api_.connect(0, g, &got), kInternalError) << "stage " << guess;
    EXPECT_EQ(got, nullptr);
  }
  unsigned char copied[kHandleMaxSize];
  std::memcpy(copied, b, sizeof copied);
  std::memcpy(copied + 16, &stage, sizeof stage);  // a's own token, on b's handle
  void* stolen = nullptr;
  NcclResult r = kSuccess;
  for (auto t0 = Clock::now(); r == kSuccess && stolen == nullptr && since(t0) < 20; std::this_thread::sleep_for(1ms))
    r = api_.connect(0, copied, &stolen);
  EXPECT_EQ(r, kInternalError) << "a copied stage took another handle's connection";
  EXPECT_EQ(stolen, nullptr);
  EXPECT_TRUE(logged("names the connect job of another handle"));
  void* rc = nullptr;
  ASSERT_EQ(connect_until(api_, 0, a, &sc), kSuccess) << "a's job is still a's";
  ASSERT_NE(sc, nullptr);
  ASSERT_EQ(accept_until(api_, la, &rc), kSuccess);
  if (stolen != nullptr) {
    EXPECT_EQ(api_.close_send(stolen), kSuccess);
  }
  EXPECT_EQ(api_.close_send(sc), kSuccess);
  EXPECT_EQ(api_.close_recv(rc), kSuccess);
  EXPECT_EQ(api_.close_listen(la), kSuccess);
  EXPECT_EQ(api_.close_listen(lb), kSuccess);
}

INSTANTIATE_TEST_SUITE_P(Versions, Nccl, ::testing::Values(11, 10), version_name);

}  // namespace
}  // namespace dmx::nccl::test
