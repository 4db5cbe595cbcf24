#include "transport/rdma/wire.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/checked.h"
#include "core/log.h"
#include "wire/le.h"

namespace dmx::rdma {

using wire::get_u16;
using wire::get_u32;
using wire::get_u64;
using wire::put_u16;
using wire::put_u32;
using wire::put_u64;

namespace {
constexpr size_t kOfferFixed = 4 + 16 + 1;  // version, flags, mtu, port; gid; name length
constexpr uint8_t kForced = 1, kEthernet = 2, kDmabuf = 4, kPeermem = 8;

Status bad_offer(const std::string& what) { return Status(Code::kUnavailable, "rdma: the peer's offer " + what); }
}  // namespace

std::vector<unsigned char> Offer::encode() const {
  size_t n = std::min(device.size(), kMaxDeviceName);
  std::vector<unsigned char> b(kOfferFixed + n);
  b[0] = kOfferVersion;
  b[1] = static_cast<unsigned char>((forced ? kForced : 0) | (ethernet ? kEthernet : 0) | (gpu_dmabuf ? kDmabuf : 0) |
                                    (gpu_peermem ? kPeermem : 0));
  b[2] = mtu;
  b[3] = port;
  std::memcpy(b.data() + 4, gid.data(), gid.size());
  b[20] = static_cast<unsigned char>(n);
  if (n > 0) std::memcpy(b.data() + kOfferFixed, device.data(), n);
  return b;
}

Result<Offer> Offer::decode(std::span<const unsigned char> b) {
  if (b.size() < kOfferFixed) return bad_offer(fmt::format("is {} B, shorter than {} B", b.size(), kOfferFixed));
  if (b[0] != kOfferVersion) return bad_offer(fmt::format("is version {}, this side speaks {}", b[0], kOfferVersion));
  if (b[1] & ~(kForced | kEthernet | kDmabuf | kPeermem)) return bad_offer(fmt::format("has unknown flags {:#x}", b[1]));
  if (b[2] < 1 || b[2] > 5) return bad_offer(fmt::format("names MTU code {} (1-5)", b[2]));
  size_t n = b[20];
  if (n > kMaxDeviceName || b.size() != kOfferFixed + n)
    return bad_offer(fmt::format("is {} B with a {}-byte device name", b.size(), n));
  Offer o;
  o.forced = b[1] & kForced;
  o.ethernet = b[1] & kEthernet;
  o.gpu_dmabuf = b[1] & kDmabuf;
  o.gpu_peermem = b[1] & kPeermem;
  o.mtu = b[2];
  o.port = b[3];
  std::memcpy(o.gid.data(), b.data() + 4, o.gid.size());
  o.device.assign(b.begin() + kOfferFixed, b.end());
  return o;
}

std::vector<unsigned char> ConnInfo::encode() const {
  std::vector<unsigned char> b(kFixed + kPerQp * qps.size());
  put_u32(b.data(), kConnMagic);
  b[4] = kConnVersion;
  b[5] = static_cast<unsigned char>(qps.size());
  b[6] = mtu;
  b[7] = credits;
  put_u16(b.data() + 8, lid);
  std::memcpy(b.data() + 10, gid.data(), gid.size());
  put_u64(b.data() + 26, max_chunk);
  for (size_t i = 0; i < qps.size(); ++i) {
    put_u32(b.data() + kFixed + kPerQp * i, qps[i].qpn);
    put_u32(b.data() + kFixed + kPerQp * i + 4, qps[i].psn);
  }
  return b;
}

Result<size_t> ConnInfo::total_size(std::span<const unsigned char> b) {
  if (b.size() != kFixed) return Status(Code::kProtocol, "rdma connection info: short fixed part");
  if (get_u32(b.data()) != kConnMagic || b[4] != kConnVersion)
    return Status(Code::kProtocol,
                  fmt::format("rdma connection info: magic {:#x} version {} (want {:#x} version {})", get_u32(b.data()),
                              b[4], kConnMagic, kConnVersion));
  if (b[5] < 1 || b[5] > kMaxQps)
    return Status(Code::kProtocol, fmt::format("rdma connection info: {} queue pairs (1-{})", b[5], kMaxQps));
  return kFixed + kPerQp * b[5];
}

Result<ConnInfo> ConnInfo::decode(std::span<const unsigned char> b, const std::string& peer) {
  auto fail = [&](std::string what) { return Status(Code::kProtocol, "rdma connection info: " + what).with_peer(peer); };
  if (b.size() < kFixed) return fail(fmt::format("{} B", b.size()));
  auto total = total_size(b.first(kFixed));
  if (!total.ok()) return total.status().with_peer(peer);
  if (b.size() != *total) return fail(fmt::format("{} B for {} queue pairs", b.size(), b[5]));
  ConnInfo c;
  c.mtu = b[6];
  if (c.mtu < 1 || c.mtu > 5) return fail(fmt::format("MTU code {} (1-5)", c.mtu));
  c.credits = b[7];
  if (c.credits < 1 || c.credits > kMaxCredits)
    return fail(fmt::format("{} small-chunk credits per queue pair (1-{})", c.credits, kMaxCredits));
  c.lid = get_u16(b.data() + 8);
  std::memcpy(c.gid.data(), b.data() + 10, c.gid.size());
  c.max_chunk = get_u64(b.data() + 26);
  if (c.max_chunk < kMinChunk || c.max_chunk > kMaxChunk)
    return fail(fmt::format("largest chunk {} B (must be {}-{})", c.max_chunk, kMinChunk, kMaxChunk));
  for (size_t i = 0; i < b[5]; ++i) {
    Qp q{get_u32(b.data() + kFixed + kPerQp * i), get_u32(b.data() + kFixed + kPerQp * i + 4)};
    if (q.qpn == 0 || q.qpn == 1 || q.qpn > kMaxQpn)
      return fail(fmt::format("queue pair number {:#x} (2-{:#x}; 0 and 1 are special)", q.qpn, kMaxQpn));
    if (q.psn > kMaxPsn) return fail(fmt::format("PSN {:#x} is over 24 bits", q.psn));
    for (const Qp& have : c.qps)
      if (have.qpn == q.qpn) return fail(fmt::format("queue pair number {:#x} named twice", q.qpn));
    c.qps.push_back(q);
  }
  return c;
}

std::vector<unsigned char> ChunkDescriptor::encode() const {
  std::vector<unsigned char> b(kSize);
  put_u64(b.data(), len);
  put_u32(b.data() + 8, token);
  put_u32(b.data() + 12, small ? 1 : 0);
  return b;
}

Result<ChunkDescriptor> ChunkDescriptor::decode(std::span<const unsigned char> b, uint64_t max, const std::string& peer) {
  if (b.size() != kSize)
    return Status(Code::kProtocol, fmt::format("rdma chunk descriptor of {} B (want {})", b.size(), kSize)).with_peer(peer);
  ChunkDescriptor d;
  d.len = get_u64(b.data());
  d.token = get_u32(b.data() + 8);
  uint32_t flags = get_u32(b.data() + 12);
  if (flags > 1) return Status(Code::kProtocol, fmt::format("rdma chunk descriptor flags {:#x}", flags)).with_peer(peer);
  d.small = flags == 1;
  if (d.token > kMaxToken)
    return Status(Code::kProtocol, fmt::format("rdma chunk token {:#x} is over 24 bits", d.token)).with_peer(peer);
  if (d.len > max)
    return Status(Code::kProtocol, fmt::format("rdma chunk of {} B is over the largest agreed, {} B", d.len, max))
        .with_peer(peer);
  if (d.small && d.len > kSmallMax)
    return Status(Code::kProtocol, fmt::format("rdma small chunk of {} B is over {} B", d.len, kSmallMax)).with_peer(peer);
  return d;
}

std::vector<unsigned char> Cts::encode() const {
  std::vector<unsigned char> b(kSize);
  put_u64(b.data(), addr);
  put_u32(b.data() + 8, rkey);
  put_u32(b.data() + 12, drop ? 1 : 0);
  return b;
}

Result<Cts> Cts::decode(std::span<const unsigned char> b, uint64_t len, const std::string& peer) {
  if (b.size() != kSize)
    return Status(Code::kProtocol, fmt::format("rdma clear-to-send of {} B (want {})", b.size(), kSize)).with_peer(peer);
  Cts c;
  c.addr = get_u64(b.data());
  c.rkey = get_u32(b.data() + 8);
  uint32_t flags = get_u32(b.data() + 12);
  if (flags > 1) return Status(Code::kProtocol, fmt::format("rdma clear-to-send flags {:#x}", flags)).with_peer(peer);
  c.drop = flags == 1;
  if (!c.drop && !checked_add(c.addr, len))
    return Status(Code::kProtocol, fmt::format("rdma clear-to-send at {:#x} + {} B wraps the address space", c.addr, len))
        .with_peer(peer);
  return c;
}

std::string gid_text(const Gid& g) {
  std::string s;
  for (size_t i = 0; i < g.size(); i += 2) s += fmt::format("{}{:02x}{:02x}", i ? ":" : "", g[i], g[i + 1]);
  return s;
}

}  // namespace dmx::rdma
