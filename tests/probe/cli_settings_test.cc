// The CLI's version, verbosity and settings checks, through the built binary.
#include <gtest/gtest.h>

#include <string>

#include "tests/probe/cli_util.h"

namespace dmx::test {
namespace {

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

TEST(CliSettings, VersionNamesRevisionAndBuild) {
  REQUIRE_DMX_BIN();
  int rc = 0;
  std::string out = run_command(dmx_bin() + " --version", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(has(out, "dmx 0.")) << out;
  EXPECT_TRUE(has(out, "git revision: ")) << out;
  EXPECT_FALSE(has(out, "git revision: \n")) << out;
  EXPECT_TRUE(has(out, "build: ")) << out;
  EXPECT_TRUE(has(out, "CUDA")) << "the build line says whether CUDA is in, and why: " << out;
}

// Quiet by default (warnings only), -v shows the info lines (the listener's address).
TEST(CliSettings, WarningsOnlyUnlessVerbose) {
  REQUIRE_DMX_BIN();
  int rc = 0;
  std::string bench = dmx_bin() + " bench --loopback --mem host --sizes 8 --iters 10";
  std::string cmd = "env -u DMX_LOG_LEVEL " + bench;
  std::string quiet = run_command(cmd + " 2>&1", &rc);
  ASSERT_EQ(rc, 0) << quiet;
  EXPECT_FALSE(has(quiet, "[info]")) << quiet;
  std::string verbose = run_command(cmd + " -v 2>&1", &rc);
  ASSERT_EQ(rc, 0) << verbose;
  EXPECT_TRUE(has(verbose, "[info]")) << verbose;
  std::string env = run_command("DMX_LOG_LEVEL=info " + bench + " 2>&1", &rc);
  EXPECT_TRUE(has(env, "[info]")) << "DMX_LOG_LEVEL still decides without -v: " << env;
}

TEST(CliSettings, UnknownDmxVariableIsReportedWithTheNearestName) {
  REQUIRE_DMX_BIN();
  int rc = 0;
  std::string out = run_command("DMX_STREEMS=4 DMX_TEST_ANYTHING=1 " + dmx_bin() + " probe --config 2>&1", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(has(out, "DMX_STREEMS is not a dmx setting (did you mean DMX_STREAMS?)")) << out;
  EXPECT_FALSE(has(out, "DMX_TEST_ANYTHING")) << "test variables are not settings: " << out;
}

}  // namespace
}  // namespace dmx::test
