// A peer that agreed a payload path announces chunk after chunk on it and never lets one finish:
// the receiver's table of path chunks in flight is bounded (max_inflight_ops), then it is a
// protocol error naming the path. The path here is a double that accepts chunks and never moves
// them, installed as the devmem transport's path (ContextImpl::register_transport).
#include <gtest/gtest.h>

#include <thread>

#include "engine/auth.h"
#include "engine/context_impl.h"
#include "engine/handshake.h"
#include "hostile/hostile_util.h"
#include "stream/socket.h"
#include "transport/devmem/devmem_transport.h"
#include "transport/path.h"

namespace dmx::test {
namespace {

using namespace std::chrono_literals;
using wire::FrameType;

// Takes every chunk and moves none; stops at once (it holds no memory).
class StuckPath final : public PayloadPath {
 public:
  std::string_view name() const override { return "devmem"; }
  void start(Events* events, std::shared_ptr<void>) override { events_ = events; }
  bool carries(const MemSpec&) const override { return true; }
  uint64_t max_chunk() const override { return 1 << 20; }
  Result<std::vector<unsigned char>> post_tx(uint64_t, const MemRegion&, bool) override {
    return Status(Code::kUnavailable, "stuck path sends nothing");
  }
  Result<uint64_t> chunk_length(std::span<const unsigned char> d) override {
    if (d.size() != 8) return Status(Code::kProtocol, "descriptor is 8 bytes");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | d[static_cast<size_t>(i)];
    return n;
  }
  Status post_rx(uint64_t, std::span<const unsigned char>, const MemRegion&) override { return Status(); }
  bool receiver_releases() const override { return false; }
  void stop() override {
    if (events_ != nullptr) std::exchange(events_, nullptr)->on_path_stopped();
  }
  PathStats stats() const override { return {}; }
  std::string describe() const override { return "stuck test path"; }

 private:
  Events* events_ = nullptr;
};

Status send_header(int fd, const wire::FrameHeader& h, const std::vector<unsigned char>& payload) {
  auto b = wire::encode_header(h);
  Deadline d = Deadline::after(5s);
  DMX_RETURN_IF_ERROR(stream::send_exact(fd, b.data(), b.size(), d, "server"));
  return payload.empty() ? Status() : stream::send_exact(fd, payload.data(), payload.size(), d, "server");
}

TEST(PathFlood, ChunksThatNeverFinishAreBoundedPerPath) {
  Options o = test_options(1);
  o.set("transport", "devmem").set("max_inflight_ops", "16");
  Server s = make_server(o);
  s.ctx.impl()->register_transport(
      make_devmem_transport([](UniqueFd, const Config&, const std::string&) -> Result<std::unique_ptr<PayloadPath>> {
        return std::unique_ptr<PayloadPath>(std::make_unique<StuckPath>());
      }));
  Buffer target = poisoned(MemSpec{}, 1 << 20);
  auto reg = s.ctx.register_memory(target.region());
  ASSERT_TRUE(reg.ok());
  AuthKey key = *load_auth_key(*Config::resolve(Options().set("auth_key", kHostileKey)));

  // A one-stream client that offers devmem, and its data socket (JOIN index 1 = streams).
  auto addr = stream::parse_address(s.listener.address());
  Deadline d = Deadline::after(5s);
  auto fd = stream::connect_to(*addr, d);
  ASSERT_TRUE(fd.ok());
  wire::Hello mine;
  mine.version = wire::kProtocolVersion;
  mine.role = wire::Role::kClient;
  mine.auth = wire::AuthMode::kHmacSha256;
  mine.streams = 1;
  mine.chunk_size = 1 << 20;
  mine.eager_limit = 16 << 10;
  mine.unexpected_budget = 1 << 20;
  mine.offers = {wire::Offer{"devmem", {1, 0}}};
  mine.nonce[0] = 9;
  mine.boot_id = "another-host";
  mine.hostname = "another-host";
  mine.peer_timeout_ms = 10000;
  ASSERT_TRUE(send_frame(fd->get(), FrameType::kHello, wire::encode_hello(mine), d, "s").ok());
  auto hello = recv_frame(fd->get(), d, "s");
  ASSERT_TRUE(hello.ok() && hello->header.type == FrameType::kHello) << hello.status().to_string();
  auto theirs = wire::decode_hello(hello->payload.data(), hello->payload.size());
  ASSERT_TRUE(theirs.ok());
  ASSERT_TRUE(theirs->offer("devmem") != nullptr) << "the server did not keep devmem";
  wire::Proof proof = make_proof(key, kClientLabel, mine.nonce, theirs->nonce, theirs->session);
  ASSERT_TRUE(send_frame(fd->get(), FrameType::kAuth, {proof.begin(), proof.end()}, d, "s").ok());
  auto welcome = recv_frame(fd->get(), d, "s");
  ASSERT_TRUE(welcome.ok() && welcome->header.type == FrameType::kWelcome) << welcome.status().to_string();
  auto data = stream::connect_to(*addr, d);
  ASSERT_TRUE(data.ok());
  wire::Join j;
  j.session = theirs->session;
  j.index = 1;
  j.streams = 1;
  j.proof = make_proof(key, kJoinLabel, mine.nonce, theirs->nonce, theirs->session, 1);
  ASSERT_TRUE(send_frame(data->get(), FrameType::kJoin, wire::encode_join(j), d, "s").ok());
  auto joined = recv_frame(data->get(), d, "s");
  ASSERT_TRUE(joined.ok() && joined->header.type == FrameType::kWelcome) << joined.status().to_string();
  auto ep = s.listener.accept(5s);
  ASSERT_TRUE(ep.ok()) << ep.status().to_string();

  // One write of 1 MiB in 1-byte devmem chunks: each is announced, none ever arrives.
  std::vector<unsigned char> one{1, 0, 0, 0, 0, 0, 0, 0};
  for (uint64_t off = 0; off < 17; ++off) {
    wire::FrameHeader h;
    h.type = FrameType::kWriteData;
    h.path = 1;  // devmem, the only transport agreed
    h.id = 1;
    h.a0 = reg->remote().key;
    h.a1 = off;
    h.a2 = 1 << 20;
    h.payload_len = 8;
    if (!send_header(fd->get(), h, one).ok()) break;
  }
  Status health = wait_for_failure(*ep, 5s);
  EXPECT_EQ(health.code(), Code::kProtocol) << health.to_string();
  EXPECT_NE(health.message().find("devmem chunks in flight"), std::string::npos) << health.to_string();
}

}  // namespace
}  // namespace dmx::test
