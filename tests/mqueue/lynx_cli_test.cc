// `dmx mqueue bench --loopback --json`: one row per system, protocol and size, with the fields
// issue 22 asks for, every answer right.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "dmx_test_paths.h"

namespace {

TEST(LynxCli, BenchLoopbackPrintsRows) {
  std::string cmd = std::string(DMX_BIN_PATH) +
                    " mqueue bench --loopback --mem host --proto udp,tcp --payload 0,100 --seconds 0.2 "
                    "--clients 2 --json 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int rc = ::pclose(p);
  ASSERT_EQ(rc, 0) << out;
  std::set<std::string> systems;
  size_t rows = 0, start = 0;
  for (size_t end; (end = out.find('\n', start)) != std::string::npos; start = end + 1) {
    auto j = nlohmann::json::parse(out.substr(start, end - start), nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << out;
    for (const char* k : {"system", "proto", "payload_bytes", "req_per_s", "p50_us", "p99_us", "responses_ok",
                          "responses_bad"})
      ASSERT_TRUE(j.contains(k)) << k << " missing in " << j.dump();
    EXPECT_EQ(j["responses_bad"].get<uint64_t>(), 0u) << j.dump();
    EXPECT_GT(j["responses_ok"].get<uint64_t>(), 0u) << j.dump();
    systems.insert(j["system"].get<std::string>());
    ++rows;
  }
  EXPECT_EQ(rows, 8u) << out;  // 2 systems x 2 protocols x 2 sizes
  EXPECT_EQ(systems, (std::set<std::string>{"dmx-lynx-udp", "dmx-lynx-tcp", "host-centric-udp", "host-centric-tcp"}));
}

}  // namespace
