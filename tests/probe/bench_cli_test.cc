// `dmx bench` options and output as people compare them with nccl-tests and perftest: size ranges,
// the per-size fields, the transport line, and refusals. Small sizes and --iters keep it quick
// under the sanitizers.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/probe/cli_util.h"

namespace {

using dmx::test::dmx_bin;
using dmx::test::json_rows;
using dmx::test::run_command;

std::string bench(const std::string& args, int* rc) {
  return run_command("DMX_LOG_LEVEL=warn " + dmx_bin() + " bench --loopback --mem host " + args, rc);
}

// -b 8 -e 64K -f 4 as nccl-tests reads it: 8, 32, ... while <= 64K, so 32K is the last.
TEST(BenchCli, RangeRowsHaveEveryField) {
  REQUIRE_DMX_BIN();
  int rc = 0;
  std::string out = bench("-b 8 -e 64K -f 4 --iters 1000 --json --transport tcp 2>/dev/null", &rc);
  ASSERT_EQ(rc, 0) << out;
  auto rows = json_rows(out);
  std::vector<uint64_t> want{8, 32, 128, 512, 2048, 8192, 32768};
  ASSERT_EQ(rows.size(), want.size()) << out;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& j = rows[i];
    ASSERT_TRUE(j.is_object()) << out;
    for (const char* k : {"size_bytes", "iters", "gb_per_s", "msg_per_s", "p50_us", "p99_us", "p999_us", "transport",
                          "reason", "cpu_pct"})
      ASSERT_TRUE(j.contains(k)) << k << " missing: " << j.dump();
    EXPECT_EQ(j["size_bytes"].get<uint64_t>(), want[i]);
    EXPECT_EQ(j["transport"], "tcp") << j.dump();
    EXPECT_FALSE(j["reason"].get<std::string>().empty()) << j.dump();
    EXPECT_GE(j["iters"].get<uint64_t>(), 1000u) << j.dump();
    EXPECT_GE(j["lat_samples"].get<uint64_t>(), 1000u) << j.dump();
    double p50 = j["p50_us"], p99 = j["p99_us"], p999 = j["p999_us"];
    EXPECT_GT(p50, 0) << j.dump();
    EXPECT_LE(p50, p99) << j.dump();
    EXPECT_LE(p99, p999) << j.dump();
    EXPECT_GT(j["gb_per_s"].get<double>(), 0) << j.dump();
    EXPECT_GT(j["msg_per_s"].get<double>(), 0) << j.dump();
    EXPECT_GE(j["cpu_pct"].get<double>(), 0) << j.dump();
  }
}

// Without --iters the small sizes still get 1,000 latency samples and 1,000+ operations.
TEST(BenchCli, DefaultCountsForSmallSizes) {
  REQUIRE_DMX_BIN();
  int rc = 0;
  std::string out = bench("--sizes 8 --json --transport tcp 2>/dev/null", &rc);
  ASSERT_EQ(rc, 0) << out;
  auto rows = json_rows(out);
  ASSERT_EQ(rows.size(), 1u) << out;
  EXPECT_GE(rows[0]["iters"].get<uint64_t>(), 1000u) << out;
  EXPECT_EQ(rows[0]["lat_samples"].get<uint64_t>(), 1000u) << out;
}

TEST(BenchCli, HeaderNamesTransportWhyAndWarmup) {
  REQUIRE_DMX_BIN();
  int rc = 0;
  std::string out = bench("--sizes 8 --iters 10 --transport tcp 2>/dev/null", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("# transport: tcp (forced by configuration (transport=tcp): "), std::string::npos) << out;
  EXPECT_NE(out.find("# warm-up: 1 untimed"), std::string::npos) << out;
  EXPECT_NE(out.find("p999 us"), std::string::npos) << out;
  // auto in one process: the line says auto chose, and why (shm where it can be set up).
  out = bench("--sizes 8 --iters 10 2>/dev/null", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("# transport: "), std::string::npos) << out;
  EXPECT_NE(out.find(" (auto: "), std::string::npos) << out;
  EXPECT_EQ(out.find("auto: auto:"), std::string::npos) << out;
}

TEST(BenchCli, RefusesBadOptions) {
  REQUIRE_DMX_BIN();
  struct Case {
    const char* args;
    const char* message;
  };
  for (const Case& c : {Case{"--streams 0", "setting streams (flag --streams): 0 is not in 1-64"},
                        Case{"--streams -1", "setting streams (flag --streams): -1 is not in 1-64"},
                        Case{"-b 8 --sizes 8,16", "not both"},
                        Case{"-b 8 -e 64 -f 1", "-f/--step-factor"},
                        Case{"-b 8 -e 64 -f 1.5", "-f/--step-factor"},
                        Case{"-b 1M -e 8", "larger than -e/--max-bytes"},
                        Case{"-b 0 -e 8", "-b/--min-bytes must be at least 1"},
                        Case{"-b 8X", "-b/--min-bytes"}}) {
    int rc = 0;
    std::string out = bench(std::string(c.args) + " --iters 10 2>&1", &rc);
    EXPECT_NE(rc, 0) << c.args << ": " << out;
    EXPECT_NE(out.find(c.message), std::string::npos) << c.args << ": " << out;
    EXPECT_EQ(out.find("# dmx bench"), std::string::npos) << c.args << " ran: " << out;
  }
}

}  // namespace
