// The CLI's version, verbosity and settings checks, through the built binary.
#include <gtest/gtest.h>

#include <random>
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

// The auth key is a secret: the settings table says that it is set and where from, never its value.
TEST(CliSettings, ConfigTableRedactsTheAuthKey) {
  REQUIRE_DMX_BIN();
  std::string key;
  std::random_device rd;
  for (int i = 0; i < 32; ++i) key += "0123456789abcdefghijklmnopqrstuvwxyz"[rd() % 36];
  for (const char* form : {"", " --json"}) {
    int rc = 0;
    std::string out = run_command("DMX_AUTH_KEY=" + key + " " + dmx_bin() + " probe --config" + form + " 2>&1", &rc);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_FALSE(has(out, key.substr(0, 16))) << "the key (or its start) was printed" << form << ": " << out;
    EXPECT_TRUE(has(out, "<set, redacted>")) << out;
    EXPECT_TRUE(has(out, "env DMX_AUTH_KEY")) << "the source is still shown: " << out;
  }
  int rc = 0;
  std::string unset = run_command("env -u DMX_AUTH_KEY " + dmx_bin() + " probe --config --json", &rc);
  ASSERT_EQ(rc, 0) << unset;
  EXPECT_FALSE(has(unset, "<set, redacted>")) << "an unset secret is shown as unset: " << unset;
}

}  // namespace
}  // namespace dmx::test
