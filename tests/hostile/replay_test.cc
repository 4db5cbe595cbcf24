// An attacker who recorded a client's handshake replays it: the server's fresh nonce makes every
// recorded proof worthless. A recorded AUTH against a new session, a recorded JOIN into a
// session it was not made for, and a JOIN before any AUTH are each refused with a reason.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <thread>

#include "engine/auth.h"
#include "engine/handshake.h"
#include "hostile/hostile_util.h"
#include "stream/socket.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;
using wire::FrameType;

struct Recorded {
  UniqueFd fd;
  wire::Hello client, server;
};

AuthKey test_key() {
  Options o;
  o.set("auth_key", kHostileKey);
  return *load_auth_key(*Config::resolve(o));
}

// Opens a connection and says HELLO (as the recorded client did: the same nonce each time).
Result<Recorded> hello(const std::string& address, uint16_t streams) {
  Recorded r;
  DMX_ASSIGN_OR_RETURN(stream::Address addr, stream::parse_address(address));
  Deadline d = Deadline::after(5s);
  DMX_ASSIGN_OR_RETURN(r.fd, stream::connect_to(addr, d));
  r.client.version = wire::kProtocolVersion;
  r.client.role = wire::Role::kClient;
  r.client.auth = wire::AuthMode::kHmacSha256;
  r.client.streams = streams;
  r.client.chunk_size = 1 << 20;
  r.client.eager_limit = 16 << 10;
  r.client.unexpected_budget = 1 << 20;
  r.client.nonce[0] = 42;
  r.client.boot_id = "recorded";
  r.client.hostname = "recorded";
  r.client.peer_timeout_ms = 10000;
  r.client.offers = {wire::Offer{"tcp", {1}}};
  DMX_RETURN_IF_ERROR(send_frame(r.fd.get(), FrameType::kHello, wire::encode_hello(r.client), d, "server"));
  DMX_ASSIGN_OR_RETURN(Frame f, recv_frame(r.fd.get(), d, "server"));
  if (f.header.type != FrameType::kHello) return Status(Code::kProtocol, "no HELLO back");
  DMX_ASSIGN_OR_RETURN(r.server, wire::decode_hello(f.payload.data(), f.payload.size()));
  return r;
}

// The server's answer to what we sent last: WELCOME, REJECT (with its text), or the connection cut.
std::string answer(int fd) {
  auto f = recv_frame(fd, Deadline::after(5s), "server");
  if (!f.ok()) return "cut: " + f.status().message();
  if (f->header.type == FrameType::kWelcome) return "welcome";
  return std::string(wire::frame_type_name(f->header.type)) + ": " + std::string(f->payload.begin(), f->payload.end());
}

TEST(Replay, RecordedAuthIsRefusedInANewSession) {
  Server s = make_server();
  AuthKey key = test_key();
  auto first = hello(s.listener.address(), 1);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  wire::Proof proof = make_proof(key, kClientLabel, first->client.nonce, first->server.nonce, first->server.session);
  ASSERT_TRUE(send_frame(first->fd.get(), FrameType::kAuth, {proof.begin(), proof.end()}, Deadline::after(5s), "s").ok());
  ASSERT_EQ(answer(first->fd.get()), "welcome");
  auto recorded_endpoint = s.listener.accept(5s);  // the genuine session
  ASSERT_TRUE(recorded_endpoint.ok());
  // The attacker replays the recorded HELLO and AUTH on a new connection.
  auto again = hello(s.listener.address(), 1);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->server.session, first->server.session);
  ASSERT_TRUE(send_frame(again->fd.get(), FrameType::kAuth, {proof.begin(), proof.end()}, Deadline::after(5s), "s").ok());
  std::string got = answer(again->fd.get());
  EXPECT_NE(got.find("REJECT"), std::string::npos) << got;
  EXPECT_NE(got.find("key"), std::string::npos) << got;
  expect_serves_a_good_client(s);
  // The genuine session's raw client never says goodbye: end it, so that closing its endpoint
  // does not wait out the goodbye's deadline.
  ::shutdown(first->fd.get(), SHUT_RDWR);
}

TEST(Replay, RecordedJoinIsRefusedForAnotherSession) {
  Server s = make_server();
  AuthKey key = test_key();
  // A real two-stream session: its JOIN for stream 1 is what the attacker records.
  auto a = hello(s.listener.address(), 2);
  ASSERT_TRUE(a.ok());
  wire::Proof pa = make_proof(key, kClientLabel, a->client.nonce, a->server.nonce, a->server.session);
  ASSERT_TRUE(send_frame(a->fd.get(), FrameType::kAuth, {pa.begin(), pa.end()}, Deadline::after(5s), "s").ok());
  wire::Join j;
  j.session = a->server.session;
  j.index = 1;
  j.streams = wire::stream_sockets(2);  // two data streams and the control stream
  j.proof = make_proof(key, kJoinLabel, a->client.nonce, a->server.nonce, a->server.session, 1);
  // A second session waits for its stream 1; the recorded JOIN, pointed at it, must not fit.
  auto b = hello(s.listener.address(), 2);
  ASSERT_TRUE(b.ok());
  wire::Proof pb = make_proof(key, kClientLabel, b->client.nonce, b->server.nonce, b->server.session);
  ASSERT_TRUE(send_frame(b->fd.get(), FrameType::kAuth, {pb.begin(), pb.end()}, Deadline::after(5s), "s").ok());
  ASSERT_EQ(answer(b->fd.get()), "welcome");  // b's AUTH was taken: only the JOIN's proof can fail
  auto addr = stream::parse_address(s.listener.address());
  auto stolen = stream::connect_to(*addr, Deadline::after(5s));
  ASSERT_TRUE(stolen.ok());
  wire::Join forged = j;
  forged.session = b->server.session;
  ASSERT_TRUE(send_frame(stolen->get(), FrameType::kJoin, wire::encode_join(forged), Deadline::after(5s), "s").ok());
  std::string got = answer(stolen->get());
  EXPECT_NE(got.find("authentication failed"), std::string::npos) << "a JOIN made for another session: " << got;
  expect_serves_a_good_client(s);
}

TEST(Replay, JoinForASessionThatNeverAuthenticatedIsRefused) {
  Server s = make_server();
  AuthKey key = test_key();
  auto a = hello(s.listener.address(), 2);  // HELLO, but no AUTH
  ASSERT_TRUE(a.ok());
  auto addr = stream::parse_address(s.listener.address());
  auto extra = stream::connect_to(*addr, Deadline::after(5s));
  ASSERT_TRUE(extra.ok());
  wire::Join j;
  j.session = a->server.session;
  j.index = 1;
  j.streams = wire::stream_sockets(2);  // two data streams and the control stream
  j.proof = make_proof(key, kJoinLabel, a->client.nonce, a->server.nonce, a->server.session, 1);
  ASSERT_TRUE(send_frame(extra->get(), FrameType::kJoin, wire::encode_join(j), Deadline::after(5s), "s").ok());
  std::string got = answer(extra->get());
  EXPECT_NE(got.find("unauthenticated session"), std::string::npos) << got;
  expect_serves_a_good_client(s);
}

}  // namespace
}  // namespace dmx::test
