// SplitRPC against hostile clients: each is refused with a message naming it, and a well-behaved
// client of the same server goes on.
#include <gtest/gtest.h>

#include "rpc/header.h"
#include "tests/rpc/rpc_test_util.h"

namespace dmx::rpc::test {
namespace {

constexpr auto kDeadline = std::chrono::seconds(10);
const MemSpec kHost{MemKind::kHost, 0};

// A raw dmx peer that has read the server's hello (and the region of its partition).
struct Raw {
  Endpoint ep;
  RemoteRegion region;
};

Raw raw_peer(Rig& r) {
  auto ep = r.client_ctx.connect(r.server->address());
  EXPECT_TRUE(ep.ok()) << ep.status().to_string();
  Wire hello{};
  Status s = ep->recv({hello.data(), hello.size(), kHost}, kTagCtrl).wait(kDeadline);
  EXPECT_TRUE(s.ok()) << s.to_string();
  auto h = parse_header(hello.data(), hello.size());
  EXPECT_TRUE(h.ok());
  auto region = RemoteRegion::parse(h->region.data(), h->region.size());
  EXPECT_TRUE(region.ok());
  return Raw{std::move(*ep), *region};
}

// Writes `n` random bytes into `slot` with the notification a client gives.
void write_payload(Raw& raw, uint32_t slot, size_t n, uint32_t slot_size) {
  auto b = random_bytes(n);
  OpOptions o;
  o.notify = true;
  o.notify_value = 1;  // the token of request()
  (void)raw.ep.write({b.data(), n, kHost}, raw.region, slot * slot_stride(slot_size), o).wait(kDeadline);
}

void send_bytes(Endpoint& ep, const std::vector<unsigned char>& b, uint64_t tag) {
  (void)ep.send({const_cast<unsigned char*>(b.data()), b.size(), kHost}, tag).wait(kDeadline);
}

Header request(uint32_t slot, uint32_t len) {
  Header h;
  h.kind = Kind::kRequest;
  h.slot = slot;
  h.payload_len = len;
  h.token = 1;
  return h;
}

std::vector<unsigned char> bytes(const Wire& w) { return {w.begin(), w.end()}; }

// Runs `attack` from a raw peer while a good client calls before and after; expects a refusal
// whose message contains `why`.
void expect_refused(Rig& r, const std::function<void(Raw&)>& attack, const std::string& why) {
  ASSERT_TRUE(r.server);
  auto good = Client::connect(r.client_ctx, r.server->address(), kDeadline);
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  auto call_ok = [&] {
    auto in = random_bytes(3000);
    std::vector<unsigned char> out(in.size());
    auto n = (*good)->call(Method::kVecop, {in.data(), in.size(), kHost}, {out.data(), out.size(), kHost}, kDeadline);
    return n.ok() && out == expected(Method::kVecop, in);
  };
  EXPECT_TRUE(call_ok());
  Raw bad = raw_peer(r);
  attack(bad);
  ASSERT_TRUE(eventually([&] { return r.server->stats().refused + r.server->stats().disconnects >= 1; }));
  ServerStats st = r.server->stats();
  if (!why.empty()) {
    EXPECT_EQ(st.refused, 1u);
    EXPECT_NE(st.last_refusal.find(why), std::string::npos) << st.last_refusal;
    EXPECT_NE(st.last_refusal.find("refused peer 127.0.0.1:"), std::string::npos) << st.last_refusal;
  }
  EXPECT_TRUE(call_ok());
  (void)bad.ep.close();
  EXPECT_TRUE(call_ok());
}

TEST(SplitRpcHostile, GarbageControlHeader) {
  Rig r = start(Mode::kCpu);
  expect_refused(r, [](Raw& raw) { send_bytes(raw.ep, random_bytes(kHeaderSize), kTagCtrl); }, "rpc control header");
}

TEST(SplitRpcHostile, OversizedControlHeader) {
  Rig r = start(Mode::kCpu);
  expect_refused(r, [](Raw& raw) { send_bytes(raw.ep, random_bytes(200), kTagCtrl); }, "larger than 64 bytes");
}

TEST(SplitRpcHostile, HeaderClaimsMoreThanASlot) {
  Rig r = start(Mode::kGpu, 4, 4, 4096);
  expect_refused(r, [](Raw& raw) { send_bytes(raw.ep, bytes(encode_header(request(0, 4097))), kTagCtrl); },
                 "4096-byte slot");
}

TEST(SplitRpcHostile, PayloadBiggerThanThePoolSlot) {
  Rig r = start(Mode::kBatch, 4, 4, 4096);
  expect_refused(r, [](Raw& raw) {
    send_bytes(raw.ep, bytes(encode_header(request(1, 100))), kTagCtrl);
    write_payload(raw, 1, 3 * 4096, 4096);  // runs over the slot into the next ones
  }, "a payload of 12288 bytes");
}

TEST(SplitRpcHostile, PayloadLengthDiffersFromItsHeader) {
  Rig r = start(Mode::kCpu);
  expect_refused(r, [](Raw& raw) {
    write_payload(raw, 2, 50, 64 << 10);  // the payload first, then its header
    send_bytes(raw.ep, bytes(encode_header(request(2, 100))), kTagCtrl);
  }, "header said 100");
}

TEST(SplitRpcHostile, SlotOutOfRange) {
  Rig r = start(Mode::kCpu);
  expect_refused(r, [](Raw& raw) { send_bytes(raw.ep, bytes(encode_header(request(99, 10))), kTagCtrl); },
                 "slot 99 of 4");
}

TEST(SplitRpcHostile, HeaderWithoutPayloadHitsTheDeadline) {
  Rig r = start(Mode::kCpu, 4, 4, 64 << 10, std::chrono::milliseconds(200));
  expect_refused(r, [](Raw& raw) { send_bytes(raw.ep, bytes(encode_header(request(0, 100))), kTagCtrl); },
                 "did not follow its header in time");
}

TEST(SplitRpcHostile, DisconnectMidRequest) {
  Rig r = start(Mode::kGpu, /*clients=*/2);
  expect_refused(r, [](Raw& raw) {
    send_bytes(raw.ep, bytes(encode_header(request(0, 60000))), kTagCtrl);
    (void)raw.ep.close();
  }, "");
  // Its partition was given back: two more clients fit beside the good one's old place.
  ASSERT_TRUE(eventually([&] { return Client::connect(r.client_ctx, r.server->address(), kDeadline).ok(); }));
}

}  // namespace
}  // namespace dmx::rpc::test
