// What a REJECT tells a peer that has not authenticated: when the two sides' auth modes differ,
// which side runs what, right on both sides.
#include <gtest/gtest.h>

#include "hostile/hostile_util.h"
#include "hostile/log_lines.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;

// One side authenticates, the other runs insecure: each side's message says that the client runs
// X and the server Y, the right way round — the server's text reaches the client in its REJECT.
void expect_mode_mismatch(bool client_insecure) {
  LogLines log;
  Options so = test_options(), co = test_options();
  (client_insecure ? co : so).set("insecure", "true");
  Server s = make_server(so);
  Context client = *Context::create(co);
  auto c = client.connect(s.listener.address());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kAuth) << c.status().to_string();
  std::string right = client_insecure
                          ? "the client runs insecure (no authentication) but the server requires authentication"
                          : "the client authenticates with a key but the server runs insecure (no authentication)";
  EXPECT_NE(c.status().message().find(right), std::string::npos) << "client: " << c.status().to_string();
  EXPECT_NE(c.status().message().find("set insecure on both sides or give both the same key"), std::string::npos)
      << c.status().to_string();
  std::vector<std::string> said;
  for (auto until = Clock::now() + 10s; said.empty() && Clock::now() < until; std::this_thread::sleep_for(10ms))
    said = log.with("refused peer");
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find(right), std::string::npos) << "server: " << said[0];
}

TEST(Reject, InsecureClientToSecureServerReadsRightOnBothSides) {
  expect_mode_mismatch(/*client_insecure=*/true);
}
TEST(Reject, SecureClientToInsecureServerReadsRightOnBothSides) {
  expect_mode_mismatch(/*client_insecure=*/false);
}

}  // namespace
}  // namespace dmx::test
