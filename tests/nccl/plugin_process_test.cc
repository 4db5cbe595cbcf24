// libnccl-net-dmx.so driven as NCCL's proxy drives a net plugin, through both exported versions
// (v10 and v11, instantiated in plugin_test.cc), against a peer process (nccl_peer).
#include "tests/nccl/plugin_fixture.h"

namespace dmx::nccl::test {
namespace {

// ---- settings, each in a process of its own (init reads them once per process) ----

// The plugin-only numbers are read whole: one that is not a number in its range fails init with a
// warning that names it, where it used to be read as 0 (no time-out, zero latency) without a word.
TEST_P(Nccl, SettingsAreReadWholeOrRefused) {
  auto run = [&](const std::vector<std::string>& env) {
    Peer peer;
    peer.start(GetParam(), "props", 0, "", env);
    std::string l = peer.line();
    int rc = peer.wait_exit();
    return l + (rc == 0 ? "" : " (exit " + std::to_string(rc) + ")");
  };
  // lo has no speed in sysfs: NCCL socket's default, 10 Gb/s.
  EXPECT_EQ(run({}), "PROPS speed 10000 latency 20");
  EXPECT_EQ(run({"DMX_NCCL_SPEED=400000", "DMX_NCCL_LATENCY_US=7.5", "DMX_NCCL_TIMEOUT=2.5"}),
            "PROPS speed 400000 latency 7.5");
  for (std::string bad :
       {"DMX_NCCL_SPEED=40G", "DMX_NCCL_SPEED=0", "DMX_NCCL_SPEED=3000000000", "DMX_NCCL_TIMEOUT=abc",
        "DMX_NCCL_TIMEOUT=-1", "DMX_NCCL_TIMEOUT=10s", "DMX_NCCL_LATENCY_US=nan", "DMX_NCCL_LATENCY_US=inf"}) {
    std::string got = run({bad});
    EXPECT_EQ(got.rfind("FAIL init 4 ", 0), 0u) << bad << ": " << got;  // ncclInvalidArgument
    EXPECT_NE(got.find(bad + ": not a number in ["), std::string::npos) << got;
  }
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

}  // namespace
}  // namespace dmx::nccl::test
