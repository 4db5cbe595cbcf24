// The rdma transport's wire formats (transport/rdma/wire.h): every field a peer sends is checked,
// with overflow-safe arithmetic. Verbs-free: runs in every build.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "transport/rdma/wire.h"
#include "wire/le.h"

namespace dmx::rdma {
namespace {

const std::string kPeer = "peer 10.0.0.2:7000";

ConnInfo good_info(int qps = 4) {
  ConnInfo c;
  c.mtu = 3;
  c.lid = 0;
  for (size_t i = 0; i < c.gid.size(); ++i) c.gid[i] = static_cast<unsigned char>(i * 7 + 1);
  c.max_chunk = 8 << 20;
  for (int i = 0; i < qps; ++i) c.qps.push_back({static_cast<uint32_t>(0x11 + i), static_cast<uint32_t>(0x1234 + i)});
  return c;
}

Status decode_info(const ConnInfo& c) { return ConnInfo::decode(c.encode(), kPeer).status(); }

TEST(RdmaWire, ConnInfoRoundTrips) {
  ConnInfo c = good_info();
  auto d = ConnInfo::decode(c.encode(), kPeer);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->gid, c.gid);
  EXPECT_EQ(d->max_chunk, c.max_chunk);
  ASSERT_EQ(d->qps.size(), 4u);
  EXPECT_EQ(d->qps[3].qpn, 0x14u);
  EXPECT_EQ(d->qps[3].psn, 0x1237u);
}

TEST(RdmaWire, ConnInfoRefusesQueuePairNumbersThatCannotBeAPeers) {
  for (uint32_t qpn : {0u, 1u, 0x1000000u, 0xFFFFFFFFu}) {
    ConnInfo c = good_info();
    c.qps[1].qpn = qpn;
    Status s = decode_info(c);
    EXPECT_EQ(s.code(), Code::kProtocol) << qpn;
    EXPECT_NE(s.to_string().find("queue pair number"), std::string::npos) << s.to_string();
    EXPECT_NE(s.to_string().find(kPeer), std::string::npos) << s.to_string();
  }
  ConnInfo dup = good_info();
  dup.qps[2].qpn = dup.qps[0].qpn;
  EXPECT_NE(decode_info(dup).message().find("named twice"), std::string::npos);
}

TEST(RdmaWire, ConnInfoRefusesBadFields) {
  ConnInfo c = good_info();
  c.qps[0].psn = 0x1000000;
  EXPECT_EQ(decode_info(c).code(), Code::kProtocol);
  c = good_info();
  c.mtu = 9;
  EXPECT_EQ(decode_info(c).code(), Code::kProtocol);
  for (uint64_t m : {uint64_t{0}, kMinChunk - 1, kMaxChunk + 1, UINT64_MAX}) {
    c = good_info();
    c.max_chunk = m;
    EXPECT_EQ(decode_info(c).code(), Code::kProtocol) << m;
  }
  // Counts: none, too many, and a count that disagrees with the length.
  std::vector<unsigned char> b = good_info().encode();
  for (unsigned char n : {0, kMaxQps + 1, 255}) {
    std::vector<unsigned char> x = b;
    x[5] = n;
    EXPECT_EQ(ConnInfo::decode(x, kPeer).status().code(), Code::kProtocol) << int(n);
    EXPECT_FALSE(ConnInfo::total_size(std::span(x).first(ConnInfo::kFixed)).ok()) << int(n);
  }
  std::vector<unsigned char> x = b;
  x[5] = 3;  // says 3, carries 4
  EXPECT_EQ(ConnInfo::decode(x, kPeer).status().code(), Code::kProtocol);
  x = b;
  x[0] ^= 1;  // magic
  EXPECT_EQ(ConnInfo::decode(x, kPeer).status().code(), Code::kProtocol);
  EXPECT_EQ(ConnInfo::decode(std::span(b).first(10), kPeer).status().code(), Code::kProtocol);
}

TEST(RdmaWire, ChunkDescriptorIsBounded) {
  ChunkDescriptor d{4096, 7, false};
  auto ok = ChunkDescriptor::decode(d.encode(), 1 << 20, kPeer);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->len, 4096u);
  EXPECT_EQ(ok->token, 7u);
  EXPECT_FALSE(ok->small);
  ChunkDescriptor big = d;
  big.len = (1 << 20) + 1;
  Status s = ChunkDescriptor::decode(big.encode(), 1 << 20, kPeer).status();
  EXPECT_EQ(s.code(), Code::kProtocol);
  EXPECT_NE(s.to_string().find(kPeer), std::string::npos);
  ChunkDescriptor small{kSmallMax, 9, true};
  EXPECT_TRUE(ChunkDescriptor::decode(small.encode(), 1 << 20, kPeer).ok());
  small.len = kSmallMax + 1;  // a "small" chunk bigger than a receive slot
  EXPECT_EQ(ChunkDescriptor::decode(small.encode(), 1 << 20, kPeer).status().code(), Code::kProtocol);
  ChunkDescriptor token{16, kMaxToken + 1, false};
  EXPECT_EQ(ChunkDescriptor::decode(token.encode(), 1 << 20, kPeer).status().code(), Code::kProtocol);
  std::vector<unsigned char> b = d.encode();
  b[12] = 2;  // unknown flag
  EXPECT_EQ(ChunkDescriptor::decode(b, 1 << 20, kPeer).status().code(), Code::kProtocol);
  b = d.encode();
  b.push_back(0);
  EXPECT_EQ(ChunkDescriptor::decode(b, 1 << 20, kPeer).status().code(), Code::kProtocol);
  b.resize(8);
  EXPECT_EQ(ChunkDescriptor::decode(b, 1 << 20, kPeer).status().code(), Code::kProtocol);
}

TEST(RdmaWire, ClearToSendCannotWrap) {
  Cts c{0x7f0000001000, 0xabcd, false};
  auto ok = Cts::decode(c.encode(), 4096, kPeer);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->addr, c.addr);
  EXPECT_EQ(ok->rkey, c.rkey);
  EXPECT_FALSE(ok->drop);
  Cts wrap{UINT64_MAX - 10, 1, false};
  Status s = Cts::decode(wrap.encode(), 100, kPeer).status();
  EXPECT_EQ(s.code(), Code::kProtocol);
  EXPECT_NE(s.to_string().find(kPeer), std::string::npos);
  std::vector<unsigned char> b = c.encode();
  b[12] = 3;
  EXPECT_EQ(Cts::decode(b, 4096, kPeer).status().code(), Code::kProtocol);
  b.resize(15);
  EXPECT_EQ(Cts::decode(b, 4096, kPeer).status().code(), Code::kProtocol);
}

TEST(RdmaWire, ConnInfoRefusesCreditsOutOfRange) {
  for (int n : {0, kMaxCredits + 1, 255}) {
    ConnInfo c = good_info();
    c.credits = static_cast<uint8_t>(n);
    EXPECT_EQ(decode_info(c).code(), Code::kProtocol) << n;
  }
  ConnInfo c = good_info();
  c.credits = 17;
  auto d = ConnInfo::decode(c.encode(), kPeer);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->credits, 17);
}

TEST(RdmaWire, OfferRoundTripsAndRefusesMalformed) {
  Offer o;
  o.forced = true;
  o.ethernet = true;
  o.gpu_dmabuf = true;
  o.mtu = 3;
  o.port = 1;
  o.gid[15] = 9;
  o.device = "rxe0";
  auto d = Offer::decode(o.encode());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_TRUE(d->forced && d->ethernet && d->gpu_dmabuf && !d->gpu_peermem);
  EXPECT_EQ(d->device, "rxe0");
  EXPECT_EQ(d->gid, o.gid);
  std::vector<unsigned char> b = o.encode();
  for (size_t cut = 0; cut < b.size(); ++cut)
    EXPECT_FALSE(Offer::decode(std::span(b).first(cut)).ok()) << cut;
  std::vector<unsigned char> x = b;
  x[1] |= 0x80;  // unknown flag
  EXPECT_FALSE(Offer::decode(x).ok());
  x = b;
  x[2] = 0;  // MTU
  EXPECT_FALSE(Offer::decode(x).ok());
  x = b;
  x[20] = 200;  // name longer than the descriptor
  EXPECT_FALSE(Offer::decode(x).ok());
  x = b;
  x[0] = 2;
  EXPECT_NE(Offer::decode(x).status().message().find("version"), std::string::npos);
}

}  // namespace
}  // namespace dmx::rdma
