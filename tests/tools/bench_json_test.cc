// The bench protocol's JSON (tools/dmx/bench_common.cc) comes from the peer: a plan or reply with
// numbers of the wrong kind must be refused (kProtocol), never converted. Regressions from
// tests/fuzz/fuzz_bench_plan.
#include <gtest/gtest.h>

#include "tools/dmx/bench.h"

namespace dmx::bench {
namespace {

std::string plan_with(const std::string& field, const std::string& value) {
  Plan p;
  p.window = 2;
  std::string s = to_json(p);
  size_t at = s.find("\"" + field + "\":");
  EXPECT_NE(at, std::string::npos);
  at += field.size() + 3;
  size_t end = s.find_first_of(",}", at);
  return s.substr(0, at) + value + s.substr(end);
}

TEST(BenchJson, PlanRoundTrips) {
  Plan p;
  p.op = "write";
  p.size = 1 << 20;
  p.window = 8;
  p.checksum = UINT64_MAX;
  auto q = plan_from_json(to_json(p));
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->size, p.size);
  EXPECT_EQ(q->checksum, p.checksum);
}

TEST(BenchJson, PlanRefusesFloatNegativeAndOversizedCounts) {
  for (auto [field, value] : {std::pair{"size", "1.5e300"}, {"size", "-1"}, {"iters", "4294967296"},
                              {"window", "2.0"}, {"checksum", "1e20"}, {"warmup", "-3"}}) {
    auto p = plan_from_json(plan_with(field, value));
    ASSERT_FALSE(p.ok()) << field << "=" << value;
    EXPECT_EQ(p.status().code(), Code::kProtocol) << p.status().to_string();
  }
}

TEST(BenchJson, ReplyRefusesFloatCounts) {
  Reply r;
  r.region = RemoteRegion{1, 2};
  std::string s = to_json(r);
  ASSERT_TRUE(reply_from_json(s).ok());
  size_t at = s.find("\"region_size\":2");
  ASSERT_NE(at, std::string::npos);
  std::string bad = s.substr(0, at) + "\"region_size\":1e300" + s.substr(at + 15);
  auto q = reply_from_json(bad);
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), Code::kProtocol);
  bad = s.substr(0, s.size() - 1) + ",\"path_chunks_inline\":-5}";
  EXPECT_FALSE(reply_from_json(bad).ok());
}

}  // namespace
}  // namespace dmx::bench
