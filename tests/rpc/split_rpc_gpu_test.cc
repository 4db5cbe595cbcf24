// SplitRPC on CUDA memory: kernels launched per request or batch, and the persistent kernel.
// Skipped, with the reason, where no GPU can be used.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "tests/rpc/rpc_test_util.h"
#include "test_env.h"

namespace dmx::rpc::test {
namespace {

constexpr auto kDeadline = std::chrono::seconds(20);
const MemSpec kHost{MemKind::kHost, 0}, kGpu{MemKind::kCuda, 0};

class SplitRpcGpu : public ::testing::TestWithParam<Mode> {};

TEST_P(SplitRpcGpu, ByteExactVecopAndMlpOnCudaMemory) {
  DMX_SKIP_WITHOUT_GPU();
  Rig r = start(GetParam(), 2, 4, 64 << 10, std::chrono::seconds(10), kGpu);
  ASSERT_TRUE(r.server);
  auto c = Client::connect(r.client_ctx, r.server->address(), kDeadline);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  for (size_t n : {size_t{0}, size_t{1}, size_t{4097}, size_t{65536}}) {
    auto in = random_bytes(n);
    std::vector<unsigned char> out(n + 1, 0xA5);
    auto got = (*c)->call(Method::kVecop, {in.data(), n, kHost}, {out.data(), out.size(), kHost}, kDeadline);
    ASSERT_TRUE(got.ok()) << n << ": " << got.status().to_string();
    ASSERT_EQ(*got, n);
    out.resize(n);
    EXPECT_EQ(out, expected(Method::kVecop, in)) << n << " bytes";
  }
  std::vector<float> x(8 * kMlpIn);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 23) * 0.05f - 0.5f;
  std::vector<unsigned char> in(x.size() * 4), out(8 * kMlpSampleOut);
  std::memcpy(in.data(), x.data(), in.size());
  auto got = (*c)->call(Method::kMlp, {in.data(), in.size(), kHost}, {out.data(), out.size(), kHost}, kDeadline);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  auto want = expected(Method::kMlp, in);
  std::vector<float> a(out.size() / 4), b(out.size() / 4);
  std::memcpy(a.data(), out.data(), out.size());
  std::memcpy(b.data(), want.data(), want.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-3f) << i;  // float sums in another order
}

INSTANTIATE_TEST_SUITE_P(AllModes, SplitRpcGpu, ::testing::Values(Mode::kCpu, Mode::kBatch, Mode::kGpu, Mode::kGraph),
                         [](const auto& info) { return std::string(mode_name(info.param)); });

}  // namespace
}  // namespace dmx::rpc::test
