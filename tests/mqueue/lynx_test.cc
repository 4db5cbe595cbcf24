// Lynx on the CPU machine: CPU workers polling host-memory queues, the dispatcher terminating
// UDP and TCP, byte-exact answers for odd sizes, both dispatch policies, client queues.
#include <random>

#include "mqueue_test_util.h"

namespace dmx::mqueue {
namespace {

using testing::Events;

TEST(MQueueLayout, RejectsBadGeometry) {
  Geometry g;
  g.slots = 12;
  EXPECT_EQ(compute_layout(g).status().code(), Code::kInvalidArgument);
  g.slots = 16;
  g.workers = 0;
  EXPECT_EQ(compute_layout(g).status().code(), Code::kInvalidArgument);
  g.workers = kMaxWorkers;
  g.slots = kMaxSlots;
  g.max_request = kMaxPayload;  // 1024 x 65536 x 16 MiB: far over the region limit, no wrap
  EXPECT_EQ(compute_layout(g).status().code(), Code::kInvalidArgument);
  g = Geometry{};
  g.call_slots = 4;  // without max_call
  EXPECT_EQ(compute_layout(g).status().code(), Code::kInvalidArgument);
}

TEST(MQueueLayout, SlotsDoNotOverlap) {
  Geometry g;
  g.workers = 3;
  g.slots = 8;
  g.max_request = 100;
  g.max_response = 7;
  g.call_slots = 2;
  g.max_call = 33;
  auto l = compute_layout(g);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  EXPECT_EQ(l->rx_slot(0, 1) - l->rx_slot(0, 0), l->rx_slot_bytes);
  EXPECT_GE(l->rx_slot_bytes, sizeof(SlotHeader) + 100);
  EXPECT_LE(l->rx_flag(2, 7) + 4, l->rx_slots);
  EXPECT_LE(l->rx_slot(2, 7) + l->rx_slot_bytes, l->crx_flags);
  EXPECT_LE(l->crx_slot(2, 1) + l->call_slot_bytes, l->worker_bytes);
  EXPECT_LE(l->ctx_slot(2, 1) + l->call_slot_bytes, l->stop);
  EXPECT_EQ(l->rx_slot(0, 0) % 64, 0u);
}

struct Case {
  bool udp;
  Policy policy;
};

class LynxEcho : public ::testing::TestWithParam<Case> {};

TEST_P(LynxEcho, ByteExactForOddSizes) {
  Events ev;
  ServerConfig cfg = testing::host_config(ev, 3, 8);
  cfg.dispatch.policy = GetParam().policy;
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  LoadConfig load;
  load.udp = GetParam().udp;
  load.address = load.udp ? (*server)->dispatcher().udp_address() : (*server)->dispatcher().tcp_address();
  load.clients = 5;
  load.requests = 300;
  load.sizes = {0, 1, 3, 17, 255, 1000, 4095, 4096};
  load.seed = std::random_device{}();
  load.timeout = std::chrono::seconds(10);
  auto r = run_load(load);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->ok, 300u) << r->first_error << "\n" << ev.all();
  EXPECT_EQ(r->bad, 0u);
  EXPECT_EQ(r->lost, 0u);
  ASSERT_TRUE((*server)->stop().ok());
  DispatcherStats st = (*server)->dispatcher().stats();
  EXPECT_EQ(st.requests, 300u);
  EXPECT_EQ(st.responses, 300u);
  EXPECT_LE(st.max_occupancy, 8u);
  EXPECT_GT(st.credit_writes, 0u);  // 300 responses over 3 workers with 8 slots need credits back
}

INSTANTIATE_TEST_SUITE_P(Lynx, LynxEcho,
                         ::testing::Values(Case{true, Policy::kRoundRobin}, Case{false, Policy::kRoundRobin},
                                           Case{true, Policy::kLeastLoaded}, Case{false, Policy::kLeastLoaded}),
                         [](const auto& info) {
                           return std::string(info.param.udp ? "Udp" : "Tcp") +
                                  (info.param.policy == Policy::kRoundRobin ? "RoundRobin" : "LeastLoaded");
                         });

TEST(LynxBaseline, HostCentricAnswersByteExact) {
  for (bool udp : {true, false}) {
    BaselineConfig b;
    b.udp = "127.0.0.1:0";
    b.tcp = "127.0.0.1:0";
    b.memory = MemSpec{MemKind::kHost, 0};
    auto server = HostCentricServer::start(b);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    LoadConfig load;
    load.udp = udp;
    load.address = udp ? (*server)->udp_address() : (*server)->tcp_address();
    load.clients = 2;
    load.requests = 100;
    load.sizes = {0, 1, 7, 4096};
    load.seed = std::random_device{}();
    load.timeout = std::chrono::seconds(10);
    auto r = run_load(load);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->ok, 100u) << (udp ? "udp: " : "tcp: ") << r->first_error;
  }
}

// The baseline's UDP side is a pool of server threads, each with its own worker, as many as the
// Lynx server has workers: with several clients waiting, every thread answers some of them.
TEST(LynxBaseline, UdpServesOnAPoolAsLargeAsLynxsWorkers) {
  BaselineConfig b;
  b.udp = "127.0.0.1:0";
  b.memory = MemSpec{MemKind::kHost, 0};
  b.udp_threads = 3;
  auto server = HostCentricServer::start(b);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  LoadConfig load;
  load.address = (*server)->udp_address();
  load.clients = 8;
  load.requests = 3000;
  load.sizes = {1, 300, 4096};
  load.seed = std::random_device{}();
  load.timeout = std::chrono::seconds(10);
  auto r = run_load(load);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->ok, 3000u) << r->first_error;
  // A thread counts an answer after sending it: the client may see the last one first.
  auto served = [&] {
    uint64_t sum = 0;
    for (uint64_t n : (*server)->stats().udp_served) sum += n;
    return sum;
  };
  EXPECT_TRUE(testing::eventually([&] { return served() == 3000u; }, std::chrono::seconds(10))) << served();
  BaselineStats st = (*server)->stats();
  ASSERT_EQ(st.udp_served.size(), 3u);
  for (uint64_t n : st.udp_served)
    EXPECT_GT(n, 0u) << "a UDP server thread answered nothing: the pool serves serially";
  b.udp_threads = 0;
  EXPECT_EQ(HostCentricServer::start(b).status().code(), Code::kInvalidArgument);
}

// Face verification: the worker calls the key-value service through its client queue.
TEST(LynxClientQueue, FaceVerificationCallsTheService) {
  auto kv = KvService::start();
  ASSERT_TRUE(kv.ok()) << kv.status().to_string();
  std::mt19937 rng(std::random_device{}());
  constexpr uint32_t kImage = 777;  // odd on purpose
  std::vector<std::vector<uint8_t>> refs(5);
  for (uint32_t id = 0; id < refs.size(); ++id) {
    refs[id].resize(id == 4 ? 5 : kImage);  // id 4: a reference of another size, never a match
    for (auto& b : refs[id]) b = static_cast<uint8_t>(rng());
    (*kv)->put(id, refs[id]);
  }
  Events ev;
  ServerConfig cfg = testing::host_config(ev, 2, 8);
  cfg.app = AppKind::kFaceVerify;
  cfg.geometry.call_slots = 4;
  cfg.geometry.max_call = 4096;
  cfg.dispatch.service = (*kv)->address();
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  for (bool udp : {true, false}) {
    LoadConfig load;
    load.udp = udp;
    load.address = udp ? (*server)->dispatcher().udp_address() : (*server)->dispatcher().tcp_address();
    load.clients = 3;
    load.requests = 60;
    load.sizes = {4 + kImage};
    // Request i asks about id i % 6 (id 5 is unknown); odd i carry the reference itself (a match).
    load.make = [&](std::vector<uint8_t>& req, uint64_t i) {
      uint32_t id = static_cast<uint32_t>(i % 6);
      std::memcpy(req.data(), &id, 4);
      for (uint32_t k = 0; k < kImage; ++k)
        req[4 + k] = (i % 2 && id < 4) ? refs[id][k] : static_cast<uint8_t>(rng());
    };
    load.check = [&](std::span<const uint8_t> req, std::span<const uint8_t> resp) {
      uint32_t id, got[2];
      std::memcpy(&id, req.data(), 4);
      if (resp.size() != 8) return false;
      std::memcpy(got, resp.data(), 8);
      std::span<const uint8_t> ref = id < refs.size() ? std::span<const uint8_t>(refs[id]) : std::span<const uint8_t>();
      uint64_t d = 0;
      for (size_t k = 0; k < std::min<size_t>(ref.size(), kImage); ++k) d += std::abs(int(req[4 + k]) - int(ref[k]));
      return got[0] == (face_match(d, kImage, ref.size()) ? 1u : 0u) && got[1] == d;
    };
    auto r = run_load(load);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->ok, 60u) << r->first_error << "\n" << ev.all();
  }
  EXPECT_EQ((*kv)->gets(), 120u);
  ASSERT_TRUE((*server)->stop().ok());
  EXPECT_EQ((*server)->dispatcher().stats().calls, 120u);
}

// The service fails under the server: calls fail, requests get error answers, nothing hangs.
TEST(LynxClientQueue, ServiceFailureGivesErrorAnswers) {
  auto kv = KvService::start();
  ASSERT_TRUE(kv.ok());
  (*kv)->put(1, std::vector<uint8_t>(16, 7));
  Events ev;
  ServerConfig cfg = testing::host_config(ev, 1, 4);
  cfg.app = AppKind::kFaceVerify;
  cfg.geometry.call_slots = 2;
  cfg.geometry.max_call = 64;
  cfg.dispatch.service = (*kv)->address();
  auto server = Server::start(cfg);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  LoadConfig load;
  load.udp = false;
  load.address = (*server)->dispatcher().tcp_address();
  load.clients = 1;
  load.requests = 1;
  load.sizes = {20};
  load.make = [](std::vector<uint8_t>& req, uint64_t) {
    req.assign(20, 7);
    req[0] = 1, req[1] = req[2] = req[3] = 0;  // id 1
  };
  load.check = [](std::span<const uint8_t>, std::span<const uint8_t> resp) { return resp.size() == 8 && resp[0] == 1; };
  load.timeout = std::chrono::seconds(10);
  auto r = run_load(load);  // the service answers: its connection is up
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->ok, 1u) << r->first_error;
  (*kv)->close_clients();
  ASSERT_TRUE(testing::eventually([&] { return ev.any_contains("service", "failed"); })) << ev.all();
  load.requests = 3;
  r = run_load(load);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->bad, 3u);  // error answers (kErrorMagic), not silence
  EXPECT_EQ(r->lost, 0u);
  ASSERT_TRUE((*server)->stop().ok());
  EXPECT_EQ((*server)->dispatcher().stats().error_responses, 3u);
}

}  // namespace
}  // namespace dmx::mqueue
