// Strings from a peer reach our errors and logs: a CLOSE reason or an ACK text with terminal
// escapes, newlines and kilobytes of filler arrives escaped and cut, so a peer can neither forge
// log lines nor fill the log.
#include <gtest/gtest.h>

#include <sstream>
#include <thread>

#include "hostile/hostile_util.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;
using wire::FrameType;

// A reason that would forge a log line and recolour the terminal, then 3 KiB of filler.
std::vector<unsigned char> hostile_text() {
  std::string t = "bye\n[00:00:00.000] [dmx] [error] forged line\x1b[31m red\r";
  t += std::string(3000, 'A');
  return {t.begin(), t.end()};
}

void expect_defused(const std::string& text) {
  EXPECT_EQ(text.find('\n'), std::string::npos) << "a raw newline from the peer";
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << "a raw escape from the peer";
  EXPECT_NE(text.find("\\x0a"), std::string::npos) << text;
  EXPECT_NE(text.find("\\x1b[31m"), std::string::npos) << text;
  EXPECT_NE(text.find("more bytes"), std::string::npos) << "not cut: " << text.size() << " bytes";
  EXPECT_LT(text.size(), 1000u);
}

TEST(LogInjection, CloseReasonIsEscapedAndCut) {
  Server s = make_server();
  auto peer = RawPeer::connect(s.listener.address(), kHostileKey);
  ASSERT_TRUE(peer.ok());
  auto ep = s.listener.accept(10s);
  ASSERT_TRUE(ep.ok());
  auto text = hostile_text();
  auto h = frame(FrameType::kClose);
  h.payload_len = static_cast<uint32_t>(text.size());
  ASSERT_TRUE(peer->send(h, text).ok());
  Status health = wait_for_failure(*ep, 5s);
  EXPECT_EQ(health.code(), Code::kClosed) << health.to_string();
  expect_defused(health.to_string());
}

TEST(LogInjection, AckTextIsEscapedAndCut) {
  Server s = make_server();
  auto peer = RawPeer::connect(s.listener.address(), kHostileKey);
  ASSERT_TRUE(peer.ok());
  auto ep = s.listener.accept(10s);
  ASSERT_TRUE(ep.ok());
  // A write from the server to the raw peer: the peer answers with a hostile refusal text.
  Filled src = filled(MemSpec{}, 100);
  Request w = ep->write(src.buf.region(), RemoteRegion{0x1234, 1 << 20}, 0);
  auto text = hostile_text();
  auto ack = frame(FrameType::kAck, 1, static_cast<uint64_t>(Code::kNotFound), static_cast<uint64_t>(wire::OpKind::kWrite));
  ack.payload_len = static_cast<uint32_t>(text.size());
  std::this_thread::sleep_for(100ms);  // the WRITE_DATA went out: op 1 is in flight
  ASSERT_TRUE(peer->send(ack, text).ok());
  Status st = w.wait(5s);
  EXPECT_EQ(st.code(), Code::kNotFound) << st.to_string();
  expect_defused(st.to_string());
}

}  // namespace
}  // namespace dmx::test
