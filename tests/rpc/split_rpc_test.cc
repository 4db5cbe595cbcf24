// SplitRPC on host memory: byte-exact results in every orchestration mode.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <condition_variable>
#include <mutex>

#include "rpc/header.h"
#include "tests/rpc/rpc_test_util.h"

namespace dmx::rpc::test {
namespace {

constexpr auto kDeadline = std::chrono::seconds(10);
const MemSpec kHost{MemKind::kHost, 0};

TEST(SplitRpcHeader, RoundTripsAndRejectsGarbage) {
  Header h;
  h.kind = Kind::kRequest;
  h.method = Method::kMlp;
  h.slot = 7;
  h.payload_len = 12345;
  h.token = 0x1122334455667788ULL;
  Wire w = encode_header(h);
  auto back = parse_header(w.data(), w.size());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->slot, 7u);
  EXPECT_EQ(back->payload_len, 12345u);
  EXPECT_EQ(back->token, h.token);
  EXPECT_EQ(back->method, Method::kMlp);
  EXPECT_FALSE(parse_header(w.data(), 63).ok());
  for (size_t i : {0u, 4u, 6u, 7u, 30u, 50u}) {
    Wire bad = w;
    bad[i] ^= 0x5a;
    EXPECT_FALSE(parse_header(bad.data(), bad.size()).ok()) << "byte " << i;
  }
  auto garbage = random_bytes(kHeaderSize);
  EXPECT_FALSE(parse_header(garbage.data(), garbage.size()).ok());
}

class SplitRpcModes : public ::testing::TestWithParam<Mode> {};

TEST_P(SplitRpcModes, ByteExactForOddSizes) {
  Rig r = start(GetParam());
  ASSERT_TRUE(r.server);
  auto c = Client::connect(r.client_ctx, r.server->address(), kDeadline);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{255}, size_t{4097}, size_t{65535}, size_t{65536}}) {
    auto in = random_bytes(n);
    std::vector<unsigned char> out(n + 1, 0xA5);
    auto got = (*c)->call(Method::kVecop, {in.data(), n, kHost}, {out.data(), out.size(), kHost}, kDeadline);
    ASSERT_TRUE(got.ok()) << n << ": " << got.status().to_string();
    ASSERT_EQ(*got, n);
    out.resize(n);
    EXPECT_EQ(out, expected(Method::kVecop, in)) << n << " bytes";
  }
}

// Every slot busy at once, from two clients: the joins of header and payload never mix slots.
TEST_P(SplitRpcModes, PipelinedCallsFromTwoClients) {
  Rig r = start(GetParam());
  ASSERT_TRUE(r.server);
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 2; ++i) {
    auto c = Client::connect(r.client_ctx, r.server->address(), kDeadline);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    clients.push_back(std::move(*c));
  }
  struct Call {
    std::vector<unsigned char> in, out;
  };
  std::vector<Call> calls;
  for (int i = 0; i < 8; ++i) calls.push_back({random_bytes(1000 + 777 * i), std::vector<unsigned char>(8000)});
  std::mutex mu;
  std::condition_variable cv;
  int done = 0, ok = 0;
  for (int i = 0; i < 8; ++i) {
    Call& k = calls[i];
    Status s = clients[i % 2]->submit(Method::kVecop, {k.in.data(), k.in.size(), kHost},
                                      {k.out.data(), k.out.size(), kHost}, kDeadline,
                                      [&, i](const Status& st, size_t n) {
                                        std::lock_guard<std::mutex> lock(mu);
                                        if (st.ok() && n == calls[i].in.size()) ++ok;
                                        ++done;
                                        cv.notify_all();
                                      });
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, kDeadline, [&] { return done == 8; }));
  }
  EXPECT_EQ(ok, 8);
  for (auto& k : calls) {
    k.out.resize(k.in.size());
    EXPECT_EQ(k.out, expected(Method::kVecop, k.in));
  }
}

// The MLP answers per 256-byte sample; a ragged request gets an error and the client goes on.
TEST_P(SplitRpcModes, MlpAndItsErrorResponse) {
  Rig r = start(GetParam());
  ASSERT_TRUE(r.server);
  auto c = Client::connect(r.client_ctx, r.server->address(), kDeadline);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  std::vector<float> x(3 * kMlpIn);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) * 0.1f - 0.8f;
  std::vector<unsigned char> in(x.size() * 4), out(3 * kMlpSampleOut);
  std::memcpy(in.data(), x.data(), in.size());
  auto bad = (*c)->call(Method::kMlp, {in.data(), 100, kHost}, {out.data(), out.size(), kHost}, kDeadline);
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument) << bad.status().to_string();
  auto got = (*c)->call(Method::kMlp, {in.data(), in.size(), kHost}, {out.data(), out.size(), kHost}, kDeadline);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(out, expected(Method::kMlp, in));
  EXPECT_EQ(r.server->stats().error_responses, 1u);
}

INSTANTIATE_TEST_SUITE_P(AllModes, SplitRpcModes, ::testing::Values(Mode::kCpu, Mode::kBatch, Mode::kGpu, Mode::kGraph),
                         [](const auto& info) { return std::string(mode_name(info.param)); });

TEST(SplitRpc, FullPoolRefusesTheNextClientWithAReason) {
  Rig r = start(Mode::kCpu, /*clients=*/1);
  ASSERT_TRUE(r.server);
  auto first = Client::connect(r.client_ctx, r.server->address(), kDeadline);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  auto second = Client::connect(r.client_ctx, r.server->address(), kDeadline);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Code::kResourceExhausted) << second.status().to_string();
  EXPECT_NE(r.server->stats().last_refusal.find("partitions"), std::string::npos);
  // The partition comes back when the first client leaves.
  (void)(*first)->close();
  first->reset();
  ASSERT_TRUE(eventually([&] { return Client::connect(r.client_ctx, r.server->address(), kDeadline).ok(); }));
}

// Clients that connect and then send nothing held every partition until they left: a new client
// was refused for as long as they stayed. Now one idle for idle_evict_after (1 s) gives its
// partition up, told why; a busy one is not evicted.
TEST(SplitRpc, IdleClientsGiveTheirPartitionToANewOne) {
  Rig r = start(Mode::kCpu, /*clients=*/2);
  ASSERT_TRUE(r.server);
  auto idle1 = Client::connect(r.client_ctx, r.server->address(), kDeadline);
  auto idle2 = Client::connect(r.client_ctx, r.server->address(), kDeadline);
  ASSERT_TRUE(idle1.ok() && idle2.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));
  auto fresh = Client::connect(r.client_ctx, r.server->address(), kDeadline);
  ASSERT_TRUE(fresh.ok()) << fresh.status().to_string();
  std::vector<unsigned char> in = random_bytes(4096), out(4096);
  auto got = (*fresh)->call(Method::kVecop, {in.data(), in.size(), kHost}, {out.data(), out.size(), kHost}, kDeadline);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(out, expected(Method::kVecop, in));
  ServerStats st = r.server->stats();
  EXPECT_NE(st.last_refusal.find("evicted peer"), std::string::npos) << st.last_refusal;
  EXPECT_NE(st.last_refusal.find("idle for"), std::string::npos) << st.last_refusal;
  // One of the idle ones was told: its next call fails rather than hangs.
  int failed = 0;
  for (auto* c : {&*idle1, &*idle2}) {
    auto again = (*c)->call(Method::kVecop, {in.data(), in.size(), kHost}, {out.data(), out.size(), kHost}, kDeadline);
    failed += again.ok() ? 0 : 1;
  }
  EXPECT_EQ(failed, 1);
}

TEST(SplitRpc, RequestLargerThanASlotIsRefusedLocally) {
  Rig r = start(Mode::kCpu, 2, 2, 1024);
  ASSERT_TRUE(r.server);
  auto c = Client::connect(r.client_ctx, r.server->address(), kDeadline);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  std::vector<unsigned char> in(1025), out(1025);
  auto got = (*c)->call(Method::kVecop, {in.data(), in.size(), kHost}, {out.data(), out.size(), kHost}, kDeadline);
  EXPECT_EQ(got.status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace dmx::rpc::test
