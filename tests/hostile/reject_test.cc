// What a REJECT tells a peer that has not authenticated: what the client needs to fix its side —
// never the server's environment (drivers, devices, settings), which only the server's log gives —
// and, when the two sides' auth modes differ, which side runs what, right on both sides.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "hostile/hostile_util.h"
#include "hostile/log_lines.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;

// A HELLO from a client on another host that offers only tcp, sent without any key; the answer.
Result<Frame> unauthenticated_hello(const std::string& address, uint16_t version = wire::kProtocolVersion) {
  DMX_ASSIGN_OR_RETURN(stream::Address addr, stream::parse_address(address));
  Deadline d = Deadline::after(10s);
  DMX_ASSIGN_OR_RETURN(UniqueFd fd, stream::connect_to(addr, d));
  wire::Hello h;
  h.version = version;
  h.role = wire::Role::kClient;
  h.auth = wire::AuthMode::kHmacSha256;
  h.streams = 1;
  h.chunk_size = 1 << 20;
  h.eager_limit = 16 << 10;
  h.unexpected_budget = 1 << 20;
  auto nonce = random_bytes(h.nonce.size());
  std::copy(nonce.begin(), nonce.end(), h.nonce.begin());
  h.boot_id = "another-host";
  h.hostname = "another-host";
  h.peer_timeout_ms = 10000;
  h.offers = {wire::Offer{"tcp", {1}}};
  DMX_RETURN_IF_ERROR(send_frame(fd.get(), wire::FrameType::kHello, wire::encode_hello(h), d, "server"));
  return recv_frame(fd.get(), d, "server");
}

// The server cannot serve this client (its transport setting forbids it): the client hears that,
// the server's log says why, with the server's own reasons.
TEST(Reject, BeforeAuthenticationSaysNothingOfTheServersEnvironment) {
  LogLines log;
  Options so = test_options();
  so.set("transport", "shm");
  Server s = make_server(so);
  auto f = unauthenticated_hello(s.listener.address());
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_EQ(f->header.type, wire::FrameType::kReject) << wire::frame_type_name(f->header.type);
  EXPECT_EQ(f->header.a0, static_cast<uint64_t>(Code::kUnavailable));
  std::string told(f->payload.begin(), f->payload.end());
  EXPECT_NE(told.find("no data path in common"), std::string::npos) << told;
  for (const char* secret : {"transport=", "shm", "cuda", "devmem", "setting", "forced", "driver"})
    EXPECT_EQ(told.find(secret), std::string::npos) << "the REJECT gives away '" << secret << "': " << told;
  std::vector<std::string> said;
  for (auto until = Clock::now() + 10s; said.empty() && Clock::now() < until; std::this_thread::sleep_for(10ms))
    said = log.with("transport=shm was forced");
  EXPECT_EQ(said.size(), 1u) << "the server's log keeps the reason";
  expect_serves_a_good_client(s);
}

// A client of another protocol version is told which side is older, from its own side: the REJECT
// reaches the client, so "peer" and "this side" must not be the server's.
TEST(Reject, ProtocolVersionMismatchSaysWhichSideIsOlder) {
  Server s = make_server();
  for (int newer : {1, 0}) {
    uint16_t v = static_cast<uint16_t>(newer ? wire::kProtocolVersion + 1 : wire::kProtocolVersion - 1);
    auto f = unauthenticated_hello(s.listener.address(), v);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    ASSERT_EQ(f->header.type, wire::FrameType::kReject) << wire::frame_type_name(f->header.type);
    std::string told(f->payload.begin(), f->payload.end());
    EXPECT_NE(told.find(fmt::format("this client speaks dmx protocol {} and the server {}", v,
                                    wire::kProtocolVersion)),
              std::string::npos)
        << told;
    EXPECT_NE(told.find(newer ? "the server is older" : "the client is older"), std::string::npos) << told;
  }
  expect_serves_a_good_client(s);
}

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
