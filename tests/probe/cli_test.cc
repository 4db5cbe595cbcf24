// `dmx topo`, `dmx probe` and `dmx bench --loopback --json` end to end, through the built binary
// (DMX_BIN).
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/probe/cli_util.h"

namespace {

using dmx::test::dmx_bin;
using dmx::test::run_command;

std::string fixture(const std::string& name) {
  const char* base = std::getenv("DMX_TEST_FIXTURES");
  return std::string(base ? base : "tests/fixtures") + "/topo/" + name;
}

TEST(Cli, TopoJsonOfTheGpuVm) {
  REQUIRE_DMX_BIN();
  int rc = 0;
  std::string out = run_command(dmx_bin() + " topo --json --sysfs-root " + fixture("gpu-vm"), &rc);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["gpus"].size(), 2u);
  ASSERT_EQ(j["gpu_gpu"].size(), 4u);
  EXPECT_EQ(j["gpu_gpu"][1]["map_type"], "NOT_SUPPORTED");
  EXPECT_EQ(j["gpu_gpu"][1]["p2pdma_distance"], 2);
  EXPECT_EQ(j["advice"][0]["verdict"], "stage-host");
  EXPECT_EQ(j["advice"][0]["staging_numa_node"], 0);
}

TEST(Cli, TopoOfANonTreeFailsClearly) {
  REQUIRE_DMX_BIN();
  int rc = 0;
  std::string out = run_command(dmx_bin() + " topo --sysfs-root /nonexistent/sysfs 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("does not exist"), std::string::npos) << out;
}

TEST(Cli, TopoCaptureReplays) {
  REQUIRE_DMX_BIN();
  char tmpl[] = "/tmp/dmx-cap-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  int rc = 0;
  std::string a = run_command(dmx_bin() + " topo --no-cuda --sysfs-root " + fixture("dual-socket-icelake") + " --capture " + dir +
                          "/c 2>/dev/null | tail -n +2",
                      &rc);
  ASSERT_EQ(rc, 0);
  std::string b = run_command(dmx_bin() + " topo --no-cuda --sysfs-root " + dir + "/c | tail -n +2", &rc);
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(a, b);
  run_command("rm -rf " + dir, &rc);
}

TEST(Cli, ProbeLinesAndConfig) {
  REQUIRE_DMX_BIN();
  int rc = 0;
  std::string out = run_command(dmx_bin() + " probe --json --no-cuda --sysfs-root " + fixture("gpu-vm"), &rc);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(j.is_array()) << out;
  bool kernel = false;
  for (const auto& c : j) {
    EXPECT_FALSE(c["detail"].get<std::string>().empty()) << c.dump();
    kernel |= c["name"] == "kernel.version";
  }
  EXPECT_TRUE(kernel);
  out = run_command(dmx_bin() + " probe --config", &rc);
  ASSERT_EQ(rc, 0);
  EXPECT_NE(out.find("sysfs_root"), std::string::npos) << out;
}

// One bench row per size with the fields scripts read, verified; in one process 1 MiB messages go
// through the shm path, whose received chunks the server reports (peer_path_chunks_received: 20
// windowed sends, a warm-up send before each of the two phases and 20 pings at least).
TEST(Cli, BenchLoopbackJson) {
  REQUIRE_DMX_BIN();
  int rc = 0;
  std::string out = run_command(
      "DMX_LOG_LEVEL=warn " + dmx_bin() + " bench --loopback --mem host --sizes 4097,1M --iters 20 --verify --json 2>/dev/null",
      &rc);
  ASSERT_EQ(rc, 0) << out;
  auto rows = dmx::test::json_rows(out);
  for (const auto& j : rows) {
    ASSERT_TRUE(j.is_object()) << out;
    for (const char* k : {"size_bytes", "gb_per_s", "p50_us", "p99_us", "transport", "mem", "peer_mem",
                          "streams", "verified", "peer_path_chunks_received", "peer_path_chunks_inline"})
      EXPECT_TRUE(j.contains(k)) << k << " missing: " << j.dump();
    EXPECT_EQ(j["verified"], true) << j.dump();
    // 1 MiB messages are path chunks (4097 bytes go inline on the control stream).
    if (j["size_bytes"] == 1048576 && j["transport"].get<std::string>().find("shm") != std::string::npos) {
      EXPECT_GE(j["peer_path_chunks_received"].get<uint64_t>(), 42u) << j.dump();
    }
  }
  EXPECT_EQ(rows.size(), 2u) << out;
}

}  // namespace
