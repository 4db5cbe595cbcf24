// Lynx with GPU workers: the persistent kernel polls queues in GPU memory. Skipped, with the
// reason, where no GPU (or no CUDA build) is present.
#include <chrono>
#include <cstdio>
#include <random>

#include "mqueue_test_util.h"
#include "test_env.h"

namespace dmx::mqueue {
namespace {

using testing::Events;

TEST(LynxGpu, PersistentKernelAnswersByteExact) {
  if (Status s = gpu_workers_available(0); !s.ok()) DMX_SKIP(::dmx::test::kNoGpu) << s.message();
  Events ev;
  ServerConfig cfg = testing::host_config(ev, 4, 16);
  cfg.memory = MemSpec{MemKind::kCuda, 0};
  // Round-robin with stream-ordered writes, least-loaded with dmx::copy_memory writes.
  for (Policy p : {Policy::kRoundRobin, Policy::kLeastLoaded}) {
    cfg.dispatch.policy = p;
    cfg.stream_writes = p == Policy::kRoundRobin;
    auto server = Server::start(cfg);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    for (bool udp : {true, false}) {
      LoadConfig load;
      load.udp = udp;
      load.address = udp ? (*server)->dispatcher().udp_address() : (*server)->dispatcher().tcp_address();
      load.clients = 6;
      load.requests = 400;
      load.sizes = {0, 1, 7, 9, 63, 4095, 4096};
      load.seed = std::random_device{}();
      load.timeout = std::chrono::seconds(10);
      auto r = run_load(load);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      EXPECT_EQ(r->ok, 400u) << (udp ? "udp, " : "tcp, ") << (cfg.stream_writes ? "stream: " : "copy_memory: ") << r->first_error << "\n" << ev.all();
    }
    EXPECT_TRUE((*server)->stop().ok());
  }
}

// The dmx faces with queues in GPU memory: two-sided requests copied in by the dispatcher, and
// remote queues written straight into GPU memory by dmx one-sided writes (the engine's device path).
TEST(LynxGpu, DmxFacesIntoGpuQueues) {
  if (Status s = gpu_workers_available(0); !s.ok()) DMX_SKIP(::dmx::test::kNoGpu) << s.message();
  Events ev;
  ServerConfig cfg = testing::host_config(ev, 4, 16);
  cfg.memory = MemSpec{MemKind::kCuda, 0};
  cfg.dispatch.dmx = "tcp://127.0.0.1:0";
  cfg.dispatch.dmx_options.set("auth_key", "lynx-gpu-test-key-0123456789").set("log_level", "error");
  cfg.dispatch.remote_queues = 2;
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  for (auto face : {LoadConfig::Face::kDmx, LoadConfig::Face::kRemote}) {
    LoadConfig load;
    load.face = face;
    load.dmx_options.set("auth_key", "lynx-gpu-test-key-0123456789").set("log_level", "error");
    load.address = (*server)->dispatcher().dmx_address();
    load.clients = 2;
    load.requests = 400;
    load.sizes = {0, 1, 7, 9, 63, 4095, 4096};
    load.seed = std::random_device{}();
    load.timeout = std::chrono::seconds(10);
    auto r = run_load(load);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->ok, 400u) << (face == LoadConfig::Face::kDmx ? "dmx: " : "remote: ") << r->first_error << "\n"
                           << ev.all();
  }
  // The remote clients have gone: the server closes their endpoints, then lends the rings again.
  // Those closes once waited the 35-s close bound each (their shm links unpinned the slots,
  // which waits for the device, busy with the workers' kernel): a few seconds, not minutes.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(testing::eventually([&] { return (*server)->dispatcher().stats().remote_lent == 0; },
                                  std::chrono::seconds(20)))
      << "the remote clients' rings were not given back within 20 s\n" << ev.all();
  std::printf("remote rings given back %.1f s after the load\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  EXPECT_TRUE((*server)->stop().ok());
  EXPECT_EQ((*server)->dispatcher().stats().remote_requests, 400u);
}

TEST(LynxGpu, FaceVerificationFromTheKernel) {
  if (Status s = gpu_workers_available(0); !s.ok()) DMX_SKIP(::dmx::test::kNoGpu) << s.message();
  auto kv = KvService::start();
  ASSERT_TRUE(kv.ok());
  std::vector<uint8_t> ref(1000);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = static_cast<uint8_t>(i * 7);
  (*kv)->put(3, ref);
  Events ev;
  ServerConfig cfg = testing::host_config(ev, 2, 8);
  cfg.memory = MemSpec{MemKind::kCuda, 0};
  cfg.app = AppKind::kFaceVerify;
  cfg.geometry.call_slots = 4;
  cfg.geometry.max_call = 4096;
  cfg.dispatch.service = (*kv)->address();
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  LoadConfig load;
  load.address = (*server)->dispatcher().udp_address();
  load.clients = 2;
  load.requests = 50;
  load.sizes = {1004};
  load.make = [&](std::vector<uint8_t>& req, uint64_t i) {
    uint32_t id = 3;
    std::memcpy(req.data(), &id, 4);
    for (size_t k = 0; k < ref.size(); ++k) req[4 + k] = static_cast<uint8_t>(ref[k] + (i % 2 ? 0 : 50));
  };
  load.check = [&](std::span<const uint8_t> req, std::span<const uint8_t> resp) {
    uint32_t got[2];
    if (resp.size() != 8) return false;
    std::memcpy(got, resp.data(), 8);
    uint64_t d = 0;
    for (size_t k = 0; k < ref.size(); ++k) d += std::abs(int(req[4 + k]) - int(ref[k]));
    return got[0] == (face_match(d, ref.size(), ref.size()) ? 1u : 0u) && got[1] == d;
  };
  load.timeout = std::chrono::seconds(10);
  auto r = run_load(load);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->ok, 50u) << r->first_error << "\n" << ev.all();
  EXPECT_TRUE((*server)->stop().ok());
}

TEST(LynxGpu, HostCentricBaselineOnTheGpu) {
  if (Status s = gpu_workers_available(0); !s.ok()) DMX_SKIP(::dmx::test::kNoGpu) << s.message();
  BaselineConfig b;
  b.udp = "127.0.0.1:0";
  b.memory = MemSpec{MemKind::kCuda, 0};
  auto server = HostCentricServer::start(b);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  LoadConfig load;
  load.address = (*server)->udp_address();
  load.requests = 100;
  load.sizes = {0, 1, 4096};
  load.timeout = std::chrono::seconds(10);
  auto r = run_load(load);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->ok, 100u) << r->first_error;
}

}  // namespace
}  // namespace dmx::mqueue
