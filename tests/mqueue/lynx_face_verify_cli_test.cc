// lynx_face_verify's command line: every bad argument is refused with a message naming it and
// exit status 2 (usage), never an abort; good arguments still run.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <vector>

#include "mqueue_test_paths.h"

namespace {

struct CliRun {
  int rc = -1;  // exit status, or 128 + signal
  std::string out;
};

CliRun run(const std::string& args) {
  std::string cmd = std::string(DMX_LYNX_FACE_VERIFY_PATH) + " " + args + " 2>&1";
  CliRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) r.out.append(buf, n);
  int st = ::pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  return r;
}

TEST(LynxFaceVerifyCli, BadArgumentsAreUsageErrors) {
  struct Case {
    std::string args, says;
  };
  std::vector<Case> cases = {
      {"--proto xyz", "--proto 'xyz': udp or tcp"},
      {"--requests abc", "--requests 'abc': expected a whole number from 1 to 100000000"},
      {"--requests 12abc", "--requests '12abc'"},
      {"--requests -1", "--requests '-1'"},
      {"--requests 0", "--requests '0'"},
      {"--requests 99999999999999999999999", "--requests '99999999999999999999999'"},
      {"--requests 100000001", "--requests '100000001'"},
      {"--workers 0", "--workers '0': expected a whole number from 1 to 64"},
      {"--workers 65", "--workers '65'"},
      {"--workers ''", "--workers ''"},
      {"--mem floppy", "--mem:"},
      {"--requests", "--requests needs a value"},
      {"--frobnicate 3", "unknown option '--frobnicate'"},
  };
  for (const Case& c : cases) {
    CliRun r = run(c.args);
    EXPECT_EQ(r.rc, 2) << c.args << ":\n" << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << ": expected '" << c.says << "' in:\n" << r.out;
    EXPECT_NE(r.out.find("usage: lynx_face_verify"), std::string::npos) << c.args << ":\n" << r.out;
  }
}

TEST(LynxFaceVerifyCli, HelpAndAGoodRun) {
  CliRun help = run("--help");
  EXPECT_EQ(help.rc, 0) << help.out;
  EXPECT_NE(help.out.find("usage: lynx_face_verify"), std::string::npos) << help.out;
  CliRun ok = run("--proto tcp --requests 40 --workers 1");
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_NE(ok.out.find("40 answers ok"), std::string::npos) << ok.out;
}

}  // namespace
