// The dmx tool's command line, through the built binary: where each setting's value comes from
// (flag > --option > DMX_<NAME> > default), bad values and typos named with what is allowed or
// the nearest name, what the bench header says about its streams, and a refused forced transport
// ending the loopback bench at once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "dmx_test_paths.h"
#include "tests/probe/cli_util.h"

namespace dmx::test {
namespace {

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

struct Outcome {
  int rc = -1;
  std::string out;  // stdout and stderr
  double seconds = 0;
};

// `env` (VAR=value ...) before the dmx command line `args`; the DMX_* variables of the test's own
// environment that are settings are cleared first. Bounded: killed after `limit_s`.
// DMX_BIN, else this build's dmx: an older binary shows what these tests catch.
std::string bin() {
  const char* b = std::getenv("DMX_BIN");
  return b != nullptr && *b != '\0' ? b : DMX_BIN_PATH;
}

Outcome dmx(const std::string& env, const std::string& args, int limit_s = 120) {
  std::string cmd = "env -u DMX_TRANSPORT -u DMX_CHECKSUM -u DMX_STREAMS -u DMX_LOG_LEVEL " + env + " timeout -s KILL " +
                    std::to_string(limit_s) + " " + bin() + " " + args + " 2>&1";
  Outcome r;
  auto t0 = std::chrono::steady_clock::now();
  r.out = run_command(cmd, &r.rc);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

const char* kBench = "bench --loopback --mem host --sizes 8 --iters 10";

TEST(CliPrecedence, EnvironmentAndOptionReachTheBench) {
  // The bench's own flags once replaced DMX_TRANSPORT, --option transport and DMX_CHECKSUM by
  // their defaults: loopback then ran on shm without a checksum.
  Outcome env = dmx("DMX_TRANSPORT=tcp", kBench);
  ASSERT_EQ(env.rc, 0) << env.out;
  EXPECT_TRUE(has(env.out, "# transport: tcp")) << env.out;
  Outcome opt = dmx("", std::string(kBench) + " --option transport=tcp");
  ASSERT_EQ(opt.rc, 0) << opt.out;
  EXPECT_TRUE(has(opt.out, "# transport: tcp")) << opt.out;
  Outcome sum = dmx("DMX_CHECKSUM=crc32c", kBench);
  ASSERT_EQ(sum.rc, 0) << sum.out;
  EXPECT_TRUE(has(sum.out, "# checksum: crc32c")) << sum.out;
  Outcome sum_opt = dmx("", std::string(kBench) + " --option checksum=crc32c");
  ASSERT_EQ(sum_opt.rc, 0) << sum_opt.out;
  EXPECT_TRUE(has(sum_opt.out, "# checksum: crc32c")) << sum_opt.out;
}

TEST(CliPrecedence, FlagBeatsOptionBeatsEnvironment) {
  Outcome opt = dmx("DMX_TRANSPORT=tcp", std::string(kBench) + " --option transport=shm");
  ASSERT_EQ(opt.rc, 0) << opt.out;
  EXPECT_TRUE(has(opt.out, "# transport: shm")) << "--option beats the environment: " << opt.out;
  Outcome flag = dmx("DMX_TRANSPORT=shm", std::string(kBench) + " --option transport=shm --transport tcp");
  ASSERT_EQ(flag.rc, 0) << flag.out;
  EXPECT_TRUE(has(flag.out, "# transport: tcp")) << "the flag beats --option: " << flag.out;
}

TEST(CliPrecedence, ConfigSaysWhereEachValueCameFrom) {
  // log_level: the tool's own default (warnings only) unless something sets it; it once read
  // "env DMX_LOG_LEVEL" with no such variable set (the tool set it for itself).
  Outcome none = dmx("", "probe --config");
  ASSERT_EQ(none.rc, 0) << none.out;
  EXPECT_TRUE(has(none.out, "warn        dmx default")) << none.out;
  EXPECT_FALSE(has(none.out, "env DMX_LOG_LEVEL")) << none.out;
  Outcome env = dmx("DMX_LOG_LEVEL=error", "probe --config");
  EXPECT_TRUE(has(env.out, "error       env DMX_LOG_LEVEL")) << env.out;
  Outcome flag = dmx("DMX_LOG_LEVEL=error", "probe --config -v");
  EXPECT_TRUE(has(flag.out, "info        flag -v")) << "-v beats the environment: " << flag.out;
  Outcome sysfs = dmx("", "probe --config --sysfs-root /sys");
  EXPECT_TRUE(has(sysfs.out, "flag --sysfs-root")) << sysfs.out;
}

TEST(CliPrecedence, BadValuesStopWithTheSettingTheSourceAndTheChoices) {
  struct Case {
    std::string env, args, message;
  };
  for (const Case& c : {
           Case{"DMX_TRANSPORT=tpc", kBench,
                "setting transport (env DMX_TRANSPORT): 'tpc' is not one of auto|"},
           Case{"DMX_TRANSPORT=tpc", kBench, "(did you mean tcp?)"},
           Case{"", std::string(kBench) + " --transport shn", "setting transport (flag --transport): 'shn'"},
           Case{"", std::string(kBench) + " --option transport=shn", "setting transport (option): 'shn'"},
           Case{"DMX_CHECKSUM=crc32", kBench,
                "setting checksum (env DMX_CHECKSUM): 'crc32' is not one of none|crc32c (did you mean crc32c?)"},
           Case{"", std::string(kBench) + " --checksum crc", "setting checksum (flag --checksum): 'crc'"},
           Case{"DMX_STREAMS=many", kBench, "setting streams (env DMX_STREAMS): 'many' is not an integer"},
           Case{"", std::string(kBench) + " --chunk-size 1K", "setting chunk_size (flag --chunk-size): 1024 is not in"},
           Case{"", std::string(kBench) + " --option trasnport=tcp",
                "unknown setting 'trasnport' (option) (did you mean transport?)"},
           Case{"DMX_LOG_LEVEL=loud", "probe --config", "setting log_level (env DMX_LOG_LEVEL): 'loud' is not one of"},
           Case{"DMX_TRANSPORT=tpc", "rpc bench --loopback --seconds 0.1", "'tpc' is not one of"},
       }) {
    Outcome r = dmx(c.env, c.args);
    EXPECT_EQ(r.rc, 2) << c.env << " " << c.args << ": " << r.out;
    EXPECT_TRUE(has(r.out, c.message)) << c.env << " " << c.args << ": " << r.out;
    EXPECT_FALSE(has(r.out, "# dmx bench")) << c.env << " " << c.args << " ran: " << r.out;
  }
}

TEST(CliHints, TyposGetTheNearestOptionOrCommand) {
  struct Case {
    std::string args, message;
  };
  for (const Case& c : {Case{"bench --loopback --size 8", "dmx bench: no option --size (did you mean --sizes?)"},
                        Case{"bnech --loopback", "dmx: no command bnech (did you mean bench?)"},
                        Case{"probe --confg", "dmx probe: no option --confg (did you mean --config?)"},
                        Case{"bench --loopback --mem host --streams=4 --verfy", "(did you mean --verify?)"}}) {
    Outcome r = dmx("", c.args);
    EXPECT_EQ(r.rc, 2) << c.args << ": " << r.out;
    EXPECT_TRUE(has(r.out, c.message)) << c.args << ": " << r.out;
  }
}

TEST(CliOutput, StreamsLineSaysWhyTheCountDiffers) {
  // One host: shm carries the payload, so --streams 8 opens one (control) stream; the header
  // once said "1 streams" and no more.
  Outcome shm = dmx("", std::string(kBench) + " --streams 8");
  ASSERT_EQ(shm.rc, 0) << shm.out;
  // shm, or cuda_ipc+shm where a GPU is usable.
  EXPECT_TRUE(has(shm.out, "# streams: 1 (")) << shm.out;
  EXPECT_TRUE(has(shm.out, "shm carries the payload; --streams applies to tcp, 8 asked)")) << shm.out;
  Outcome tcp = dmx("", std::string(kBench) + " --streams 4 --transport tcp");
  ASSERT_EQ(tcp.rc, 0) << tcp.out;
  EXPECT_TRUE(has(tcp.out, "# streams: 5 (4 data + 1 control)")) << tcp.out;
}

// dmx topo lists the pools an engine publishes here: pinned per node, a GPU pool per GPU, the
// published p2pmem BAR with what the kernel says is allocated; the same in --json.
TEST(CliTopo, ShowsThePublishedPools) {
  const char* base = std::getenv("DMX_TEST_FIXTURES");
  std::string root = std::string(base ? base : "tests/fixtures") + "/topo/dual-socket-icelake";
  Outcome r = dmx("", "topo --sysfs-root " + root);
  ASSERT_EQ(r.rc, 0) << r.out;
  for (const char* line : {"Memory pools", "pinned:node1", "cuda:0 (0000:03:00.0)", "cuda:1 (0000:83:00.0)",
                           "0000:05:00.0 p2pmem", "kernel: 16 MiB of 16 MiB available, 0 B allocated by all processes"})
    EXPECT_TRUE(has(r.out, line)) << line << "\n" << r.out;
  Outcome j = dmx("", "topo --json --sysfs-root " + root);
  ASSERT_EQ(j.rc, 0) << j.out;
  EXPECT_TRUE(has(j.out, "\"pools\": [")) << j.out;
  EXPECT_TRUE(has(j.out, "\"held_by\"")) << j.out;
}

TEST(CliLoopback, RefusedForcedTransportEndsAtOnce) {
  // The loopback server's accept (30 s) was joined after the refused connect. A refusal takes
  // milliseconds; 20 s leaves room for a busy machine and still fails the old code. Any forced
  // transport the loopback pair refuses: cuda_ipc without a usable GPU, devmem without a devmem NIC
  // on 127.0.0.1 (every machine here).
  int refused = 0;
  for (const char* t : {"cuda_ipc", "devmem"}) {
    Outcome r = dmx("", std::string("bench --loopback --mem host --sizes 8 --iters 10 --transport ") + t, 60);
    if (r.rc == 0) continue;  // not refused here (cuda_ipc on a GPU machine)
    ++refused;
    EXPECT_EQ(r.rc, 1) << t << ": " << r.out;
    EXPECT_TRUE(has(r.out, t)) << r.out;
    EXPECT_LT(r.seconds, 20.0) << t << ": " << r.out;
  }
  if (refused == 0) DMX_SKIP(kNotExercised) << "neither cuda_ipc nor devmem was refused here";
}

}  // namespace
}  // namespace dmx::test
