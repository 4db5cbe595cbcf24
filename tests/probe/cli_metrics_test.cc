// `dmx bench --listen --metrics-port` end to end: the server's counters grow with a client's run.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "probe/cli_util.h"

namespace dmx::test {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The first match of `re`'s group 1 in the file, waiting up to 10 s for it to appear.
std::string wait_for(const std::string& path, const std::regex& re, pid_t child) {
  for (int i = 0; i < 1000; ++i) {
    std::smatch m;
    std::string text = read_file(path);
    if (std::regex_search(text, m, re)) return m[1];
    if (::waitpid(child, nullptr, WNOHANG) == child) return "exited: " + text;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return "";
}

double tcp_received(const std::string& url) {
  int rc = 0;
  std::string text = run_command(
      "python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], "
      "timeout=10).read().decode())' " +
          url,
      &rc);
  EXPECT_EQ(rc, 0) << text;
  std::smatch m;
  static const std::regex line(R"re(\ndmx_bytes_total\{transport="tcp",direction="received"\} (\d+)\n)re");
  EXPECT_TRUE(std::regex_search(text, m, line)) << text;
  EXPECT_NE(text.find("# TYPE dmx_operation_latency_microseconds histogram"), std::string::npos) << text;
  return m.empty() ? -1 : std::stod(m[1]);
}

TEST(CliMetrics, BenchServerCountersGrowWithAClientRun) {
  REQUIRE_DMX_BIN();
  char dir[] = "/tmp/dmx-metrics-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  std::string log = std::string(dir) + "/server.log";
  std::string bin = dmx_bin();
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 2);
    ::dup2(fd, 1);
    ::execl(bin.c_str(), bin.c_str(), "bench", "--listen", "tcp://127.0.0.1:0", "--metrics-port", "0", "--insecure",
            "--transport", "tcp", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::string port = wait_for(log, std::regex(R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)"), child);
  if (port.empty() || port.starts_with("exited")) {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    FAIL() << "no metrics port: " << read_file(log);
  }
  std::string addr = wait_for(log, std::regex(R"(serving on (tcp://\S+))"), child);
  std::string url = "http://127.0.0.1:" + port + "/metrics";
  double before = tcp_received(url);
  int rc = 0;
  std::string out = run_command(
      bin + " bench --connect " + addr + " --insecure --transport tcp --mem host --sizes 4K --iters 10 --json 2>&1",
      &rc);
  EXPECT_EQ(rc, 0) << out;
  double after = tcp_received(url);
  EXPECT_GE(after - before, 10 * 4096) << "before " << before << ", after " << after;
  // Stops on SIGTERM, its threads joined, exit 0.
  ::kill(child, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << read_file(log);
  std::remove(log.c_str());
  ::rmdir(dir);
}

TEST(CliMetrics, MetricsPortNeedsListen) {
  REQUIRE_DMX_BIN();
  int rc = 0;
  std::string out = run_command(dmx_bin() + " bench --loopback --metrics-port 0 --sizes 8 2>&1", &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--metrics-port needs --listen"), std::string::npos) << out;
}

}  // namespace
}  // namespace dmx::test
