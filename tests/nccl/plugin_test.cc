// libnccl-net-dmx.so driven as NCCL's proxy drives a net plugin, through both exported versions
// (v10 and v11): in this process (both ends), and against a peer process (nccl_peer).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <thread>

#include "dmx/dmx.h"
#include "nccl/nccl_test_paths.h"
#include "tests/nccl/harness.h"
#include "test_env.h"

extern char** environ;

namespace dmx::nccl::test {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

const bool kEnvSet = (set_test_env(), true);

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

uint64_t fresh_seed() { return std::random_device{}() * 0x100000001ull + std::random_device{}(); }

bool logged(const std::string& what) {
  for (const auto& l : logged_lines())
    if (l.find(what) != std::string::npos) return true;
  return false;
}

// The peer process, with a pipe to its stdin and one from its stdout.
class Peer {
 public:
  ~Peer() { kill(); }
  // `mem`: "" (host), "cuda" (cudaMalloc on cuda:0) or "cumem:GPU" (nccl_peer.cc).
  void start(int version, const std::string& role, uint64_t seed, const std::string& mem = "") {
    int in[2], out[2];
    ASSERT_EQ(::pipe2(in, O_CLOEXEC), 0);
    ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    std::string v = std::to_string(version), s = std::to_string(seed);
    std::vector<char*> argv = {const_cast<char*>(DMX_NCCL_PEER_PATH), const_cast<char*>(DMX_NCCL_PLUGIN_PATH),
                               v.data(), const_cast<char*>(role.c_str()), s.data()};
    if (!mem.empty()) argv.push_back(const_cast<char*>(mem.c_str()));
    argv.push_back(nullptr);
    ASSERT_EQ(::posix_spawn(&pid_, DMX_NCCL_PEER_PATH, &fa, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1];
    from_ = ::fdopen(out[0], "r");
  }
  // The next line the peer prints (without the newline); "" at its end.
  std::string line() {
    char buf[1024];
    if (from_ == nullptr || std::fgets(buf, sizeof buf, from_) == nullptr) return {};
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  void say(const std::string& s) {
    std::string l = s + "\n";
    ASSERT_EQ(::write(to_, l.data(), l.size()), static_cast<ssize_t>(l.size()));
  }
  void kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    if (to_ >= 0) ::close(to_), to_ = -1;
    if (from_ != nullptr) std::fclose(from_), from_ = nullptr;
  }
  int wait_exit() {
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1;
  FILE* from_ = nullptr;
};

std::string hex(const unsigned char* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += d[p[i] >> 4], s += d[p[i] & 15];
  return s;
}
void unhex(const std::string& s, unsigned char* out, size_t n) {
  ASSERT_EQ(s.size(), 2 * n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<unsigned char>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
}

class Nccl : public ::testing::TestWithParam<int> {
 protected:
  // A comm with the peer process: we listen and it connects (we_receive), or the other way round.
  void open_comm(Peer& peer, bool we_receive, void** comm) {
    unsigned char h[kHandleMaxSize] = {};
    if (we_receive) {
      void* lc = nullptr;
      ASSERT_EQ(api_.listen(0, h, &lc), kSuccess);
      peer.say("HANDLE " + hex(h, sizeof h));
      ASSERT_EQ(accept_until(api_, lc, comm), kSuccess);
      ASSERT_EQ(api_.close_listen(lc), kSuccess);
    } else {
      std::string l = peer.line();
      ASSERT_EQ(l.rfind("HANDLE ", 0), 0u) << l;
      unhex(l.substr(7), h, sizeof h);
      ASSERT_EQ(connect_until(api_, 0, h, comm), kSuccess);
    }
  }
  void SetUp() override {
    std::string e = api_.load(DMX_NCCL_PLUGIN_PATH, GetParam());
    ASSERT_TRUE(e.empty()) << e;
    ASSERT_EQ(api_.init(), kSuccess);
  }
  void TearDown() override { EXPECT_EQ(api_.finalize(), kSuccess); }

  // Both ends in this process: listen, then connect and accept polled in turn.
  void pair(void** sc, void** rc, void** lc_out = nullptr) {
    unsigned char h[kHandleMaxSize] = {};
    void* lc = nullptr;
    ASSERT_EQ(api_.listen(0, h, &lc), kSuccess);
    ASSERT_NE(lc, nullptr);
    *sc = *rc = nullptr;
    auto t0 = Clock::now();
    while ((*sc == nullptr || *rc == nullptr) && since(t0) < 20) {
      if (*sc == nullptr) {
        ASSERT_EQ(api_.connect(0, h, sc), kSuccess);
      }
      if (*rc == nullptr) {
        ASSERT_EQ(api_.accept(lc, rc), kSuccess);
      }
      std::this_thread::sleep_for(200us);
    }
    ASSERT_NE(*sc, nullptr);
    ASSERT_NE(*rc, nullptr);
    if (lc_out) *lc_out = lc;
    else ASSERT_EQ(api_.close_listen(lc), kSuccess);
  }

  // Tests `req` until done or `seconds`; returns test()'s result (kSystemError + 100 on time-out).
  int wait(void* req, int* sizes = nullptr, double seconds = 10) {
    auto t0 = Clock::now();
    for (;;) {
      int done = 0;
      NcclResult r = api_.test(req, &done, sizes);
      if (r != kSuccess || done) return r;
      if (since(t0) > seconds) return 100 + kSystemError;
      std::this_thread::sleep_for(100us);
    }
  }

  Api api_;
};

std::string version_name(const ::testing::TestParamInfo<int>& i) { return "v" + std::to_string(i.param); }

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

// ---- two processes ----

// This process receives the plan and the peer sends it; then the other way round.
TEST_P(Nccl, TwoProcessesMoveEveryMessageByteExact) {
  for (bool we_receive : {true, false}) {
    SCOPED_TRACE(we_receive ? "peer sends" : "peer receives");
    const uint64_t seed = fresh_seed();
    Peer peer;
    peer.start(GetParam(), we_receive ? "send" : "recv", seed);
    void* comm = nullptr;
    ASSERT_NO_FATAL_FAILURE(open_comm(peer, we_receive, &comm));
    Plan plan = make_plan(seed, 150, 8);
    Region region;
    ASSERT_EQ(make_region(false, plan.region_bytes, &region), "");
    if (!we_receive) {
      ASSERT_EQ(write_region(region, sender_bytes(plan, seed)), "");
    }
    Side side{&api_, comm, region.data(), nullptr, false};
    ASSERT_EQ(api_.reg_mr(comm, region.data(), plan.region_bytes, kPtrHost, &side.mh), kSuccess);
    auto t0 = Clock::now();
    EXPECT_EQ(we_receive ? run_recvs(side, plan, seed, 32) : run_sends(side, plan, seed, 200), "");
    std::printf("%s %zu messages (%zu groups, %.1f MiB) in %.3f s\n", we_receive ? "received" : "sent",
                plan.send_order.size(), plan.groups.size(), plan.region_bytes / 1048576.0, since(t0));
    if (we_receive) {
      EXPECT_EQ(verify(region.host, plan, seed), "");
    }
    peer.say("BYE");
    EXPECT_EQ(peer.line(), "OK");
    EXPECT_EQ(peer.wait_exit(), 0);
    EXPECT_EQ(api_.dereg_mr(comm, side.mh), kSuccess);
    EXPECT_EQ(we_receive ? api_.close_recv(comm) : api_.close_send(comm), kSuccess);
    // Large messages were striped: every data stream of the comm carried payload (stream 0, the
    // control stream beside two data streams, carries only eager messages).
    std::string closed;
    for (const auto& l : logged_lines())
      if (l.find(we_receive ? "recv comm with" : "send comm with") != std::string::npos &&
          l.find("closed:") != std::string::npos)
        closed = l;
    ASSERT_FALSE(closed.empty()) << "closing a comm logs its striping";
    std::printf("%s\n", closed.c_str());
    std::string per = closed.substr(closed.find("per stream: ") + 12);
    int streams = 0;
    for (size_t pos = 0; pos < per.size();) {
      size_t end = per.find(' ', pos);
      if (end == std::string::npos) end = per.size();
      if (streams > 0) {
        EXPECT_GT(std::stoull(per.substr(pos, end - pos)), 0u) << closed;
      }
      ++streams;
      pos = end + 1;
    }
    EXPECT_EQ(streams, 3) << closed;
  }
}

// The peer is killed while 1 MiB messages stream: every request in flight here fails, in time.
TEST_P(Nccl, PeerKilledMidTransferFailsEveryRequest) {
  for (bool we_receive : {true, false}) {
    SCOPED_TRACE(we_receive ? "peer floods us" : "we flood the peer");
    Peer peer;
    peer.start(GetParam(), we_receive ? "flood" : "sink", 1);
    void* comm = nullptr;
    ASSERT_NO_FATAL_FAILURE(open_comm(peer, we_receive, &comm));
    std::vector<unsigned char> buf(8u << 20);
    void* mh = nullptr;
    ASSERT_EQ(api_.reg_mr(comm, buf.data(), buf.size(), kPtrHost, &mh), kSuccess);
    std::deque<void*> flying;
    int completed = 0, posted = 0;
    // Requests complete in order, so post k reuses the buffer of post k - 8, done by then.
    auto post = [&]() {
      void* req = nullptr;
      unsigned char* p = buf.data() + (posted++ % 8) * (1u << 20);
      if (we_receive) {
        void* d[1] = {p};
        size_t sz[1] = {1u << 20};
        int tg[1] = {0};
        void* m[1] = {mh};
        ASSERT_EQ(api_.irecv(comm, 1, d, sz, tg, m, &req), kSuccess);
      } else {
        ASSERT_EQ(api_.isend(comm, p, 1u << 20, 0, mh, &req), kSuccess);
      }
      flying.push_back(req);
    };
    for (int i = 0; i < 8; ++i) post();
    auto t0 = Clock::now();
    while (completed < 16 && since(t0) < 20) {
      int done = 0;
      ASSERT_EQ(api_.test(flying.front(), &done, nullptr), kSuccess);
      if (done) {
        flying.pop_front();
        ++completed;
        post();
      }
    }
    ASSERT_GE(completed, 16) << "the stream did not get going";
    peer.kill();
    // What was already on its way may still complete; from then on every request fails, and
    // none hangs. Keep NCCL's pattern (test the oldest, post another) until a failure comes.
    auto tk = Clock::now();
    int failed = 0, succeeded = 0;
    while (!flying.empty() && since(tk) < 60) {
      int r = wait(flying.front(), nullptr, 10);
      ASSERT_LT(r, 100) << "a request hung after the peer died";
      flying.pop_front();
      if (r == kSuccess) {
        ++succeeded;
        if (failed == 0) post();
      } else {
        ++failed;
      }
    }
    double took = since(tk);
    EXPECT_TRUE(flying.empty());
    EXPECT_GE(failed, 1) << "requests after the peer's death must fail";
    EXPECT_LT(took, 10) << "failures must come from the death, long before peer_timeout (60 s)";
    std::printf("peer killed: %d requests completed after the kill, then %d failed, within %.3f s\n", succeeded,
                failed, took);
    EXPECT_EQ(api_.dereg_mr(comm, mh), kSuccess);
    EXPECT_EQ(we_receive ? api_.close_recv(comm) : api_.close_send(comm), kSuccess);
  }
}

// The rate of 1 MiB host messages from a peer process, 8 receives in flight (NCCL's pattern), for
// the record: loopback, so it says what the plugin and dmx cost, not what a NIC gives.
TEST_P(Nccl, TwoProcessesStreamingRate) {
  Peer peer;
  peer.start(GetParam(), "flood", 1);
  void* comm = nullptr;
  ASSERT_NO_FATAL_FAILURE(open_comm(peer, /*we_receive=*/true, &comm));
  std::vector<unsigned char> buf(8u << 20);
  void* mh = nullptr;
  ASSERT_EQ(api_.reg_mr(comm, buf.data(), buf.size(), kPtrHost, &mh), kSuccess);
  std::deque<void*> flying;
  int posted = 0, received = 0;
  auto post = [&]() {
    void* d[1] = {buf.data() + (posted++ % 8) * (1u << 20)};
    size_t sz[1] = {1u << 20};
    int tg[1] = {0};
    void* m[1] = {mh};
    void* req = nullptr;
    ASSERT_EQ(api_.irecv(comm, 1, d, sz, tg, m, &req), kSuccess);
    flying.push_back(req);
  };
  for (int i = 0; i < 8; ++i) post();
  Clock::time_point t0;
  while (received < 512) {
    int done = 0, size = 0;
    ASSERT_EQ(api_.test(flying.front(), &done, &size), kSuccess);
    if (!done) {
      std::this_thread::yield();  // as NCCL's proxy thread does when idle
      continue;
    }
    ASSERT_EQ(size, 1 << 20);
    flying.pop_front();
    if (++received == 32) t0 = Clock::now();  // past the start
    post();
  }
  double s = since(t0);
  std::printf("v%d: %d x 1 MiB received in %.3f s: %.2f GB/s\n", GetParam(), received - 32, s,
              (received - 32) * 1048576.0 / s / 1e9);
  peer.kill();
  for (void* req : flying) EXPECT_LT(wait(req), 100);
  EXPECT_EQ(api_.dereg_mr(comm, mh), kSuccess);
  EXPECT_EQ(api_.close_recv(comm), kSuccess);
}

TEST_P(Nccl, CudaPointersMoveBetweenTwoProcesses) {
  Status gpu = mem_available(MemSpec{MemKind::kCuda, 0});
  if (!gpu.ok()) DMX_SKIP(::dmx::test::kNoGpu) << gpu.message();
  PropertiesV11 p;
  ASSERT_EQ(api_.properties(0, &p), kSuccess);
  ASSERT_TRUE(p.ptr_support & kPtrCuda) << "a GPU is here but the plugin does not offer NCCL_PTR_CUDA";
  const uint64_t seed = fresh_seed();
  Peer peer;
  peer.start(GetParam(), "send", seed, "cuda");
  void* comm = nullptr;
  ASSERT_NO_FATAL_FAILURE(open_comm(peer, /*we_receive=*/true, &comm));
  Plan plan = make_plan(seed, 150, 8);
  Region region;
  ASSERT_EQ(make_region(true, plan.region_bytes, &region), "");
  Side side{&api_, comm, region.data(), nullptr, true};
  ASSERT_EQ(api_.reg_mr(comm, region.data(), plan.region_bytes, kPtrCuda, &side.mh), kSuccess);
  auto t0 = Clock::now();
  EXPECT_EQ(run_recvs(side, plan, seed, 32), "");
  std::printf("CUDA -> CUDA: %zu messages (%.1f MiB) in %.3f s\n", plan.send_order.size(),
              plan.region_bytes / 1048576.0, since(t0));
  std::vector<unsigned char> got(plan.region_bytes);
  ASSERT_EQ(read_region(region, &got), "");
  EXPECT_EQ(verify(got, plan, seed), "");
  peer.say("BYE");
  EXPECT_EQ(peer.line(), "OK");
  EXPECT_EQ(peer.wait_exit(), 0);
  EXPECT_EQ(api_.dereg_mr(comm, side.mh), kSuccess);
  EXPECT_EQ(api_.close_recv(comm), kSuccess);
}

// NCCL's own buffers, as NCCL_NET_GDR_LEVEL=SYS hands them to the plugin: a cuMem allocation that
// only its GPU may access, registered by dma-buf, each process on its own GPU (made current on the
// calling thread, as NCCL's proxy thread does). Both directions: this process on cuda:1 receives
// from the peer on cuda:0, then sends to it. The plugin's copies run on dmx's stream threads,
// whose current context was another device's (or none), and the driver checks a copy's addresses
// against the current context: before the copy queue made its device's context current, the first
// receive into cuda:1 failed with cudaErrorInvalidValue, as in the two-GPU NCCL run (issue 46).
TEST_P(Nccl, NcclCuMemBuffersMoveBetweenTwoGpus) {
  std::string why;
  if (int n = gpu_count(&why); n < 2) {
    if (n == 0) DMX_SKIP(::dmx::test::kNoGpu) << why;
    DMX_SKIP(::dmx::test::kFewGpus) << "needs 2 CUDA devices, " << n << " visible";
  }
  PropertiesV11 p;
  ASSERT_EQ(api_.properties(0, &p), kSuccess);
  ASSERT_TRUE(p.ptr_support & kPtrDmaBuf) << "two GPUs are here but the plugin does not offer NCCL_PTR_DMABUF";
  ASSERT_EQ(use_gpu(1), "");
  struct Restore {
    ~Restore() { (void)use_gpu(0); }
  } restore;
  for (bool we_receive : {true, false}) {
    SCOPED_TRACE(we_receive ? "cuda:0 -> cuda:1 (this process receives)" : "cuda:1 -> cuda:0 (this process sends)");
    const uint64_t seed = fresh_seed();
    Peer peer;
    peer.start(GetParam(), we_receive ? "send" : "recv", seed, "cumem:0");
    void* comm = nullptr;
    ASSERT_NO_FATAL_FAILURE(open_comm(peer, we_receive, &comm));
    Plan plan = make_plan(seed, 150, 8);
    Region region;
    ASSERT_EQ(make_region(RegionKind::kNcclCuMem, 1, plan.region_bytes, &region), "");
    if (!we_receive) {
      ASSERT_EQ(write_region(region, sender_bytes(plan, seed)), "");
    }
    Side side{&api_, comm, region.data(), nullptr, true};
    std::string how;
    ASSERT_EQ(register_region(api_, comm, region, plan.region_bytes, &side.mh, &how), "");
    std::printf("registered by %s\n", how.c_str());
    auto t0 = Clock::now();
    EXPECT_EQ(we_receive ? run_recvs(side, plan, seed, 32) : run_sends(side, plan, seed, 200), "");
    std::printf("%s: %zu messages (%.1f MiB) in %.3f s\n", we_receive ? "cuda:0 -> cuda:1" : "cuda:1 -> cuda:0",
                plan.send_order.size(), plan.region_bytes / 1048576.0, since(t0));
    if (we_receive) {
      std::vector<unsigned char> got(plan.region_bytes);
      ASSERT_EQ(read_region(region, &got), "");
      EXPECT_EQ(verify(got, plan, seed), "");
    }
    peer.say("BYE");
    EXPECT_EQ(peer.line(), "OK");  // the peer receiving checked every byte itself
    EXPECT_EQ(peer.wait_exit(), 0);
    EXPECT_EQ(api_.dereg_mr(comm, side.mh), kSuccess);
    EXPECT_EQ(we_receive ? api_.close_recv(comm) : api_.close_send(comm), kSuccess);
  }
}

INSTANTIATE_TEST_SUITE_P(Versions, Nccl, ::testing::Values(11, 10), version_name);

}  // namespace
}  // namespace dmx::nccl::test
