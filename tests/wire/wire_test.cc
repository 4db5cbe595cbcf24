// The wire format: round trips, and every kind of malformed or truncated input.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "wire/frame.h"
#include "wire/handshake.h"
#include "wire/le.h"

namespace dmx::wire {
namespace {

const Limits kLimits{1 << 20, 16 << 10};

// The wire is little-endian on every host, whatever the helpers compile to.
TEST(Le, BytesAreLittleEndianAtAnyAlignment) {
  unsigned char buf[16];
  for (size_t at = 0; at < 8; ++at) {
    std::memset(buf, 0xee, sizeof buf);
    put_u64(buf + at, 0x0102030405060708ull);
    for (size_t i = 0; i < 8; ++i) EXPECT_EQ(buf[at + i], 8 - i) << "at " << at;
    EXPECT_EQ(buf[at + 8], 0xee);  // nothing past the value
    EXPECT_EQ(get_u64(buf + at), 0x0102030405060708ull);
    put_u32(buf + at, 0xa1b2c3d4u);
    EXPECT_EQ(buf[at], 0xd4);
    EXPECT_EQ(buf[at + 3], 0xa1);
    EXPECT_EQ(buf[at + 4], 4);  // the u64's byte beyond, untouched
    EXPECT_EQ(get_u32(buf + at), 0xa1b2c3d4u);
    put_u16(buf + at, 0xbeef);
    EXPECT_EQ(buf[at], 0xef);
    EXPECT_EQ(buf[at + 1], 0xbe);
    EXPECT_EQ(get_u16(buf + at), 0xbeef);
  }
}

FrameHeader sample() {
  FrameHeader h;
  h.type = FrameType::kWriteData;
  h.flags = kFlagNotify;
  h.payload_len = 4097;
  h.id = 0x0102030405060708ull;
  h.a0 = ~0ull;
  h.a1 = 17;
  h.a2 = 1ull << 40;
  h.a3 = 42;
  return h;
}

TEST(Frame, RoundTrip) {
  FrameHeader h = sample();
  HeaderBytes b = encode_header(h);
  EXPECT_EQ(b[0], 'D');
  EXPECT_EQ(b[3], '1');
  auto d = decode_header(b.data(), kLimits);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->type, h.type);
  EXPECT_EQ(d->flags, h.flags);
  EXPECT_EQ(d->payload_len, h.payload_len);
  EXPECT_EQ(d->id, h.id);
  EXPECT_EQ(d->a0, h.a0);
  EXPECT_EQ(d->a2, h.a2);
  EXPECT_EQ(d->a3, h.a3);
}

Status decode_modified(void (*mod)(HeaderBytes&)) {
  HeaderBytes b = encode_header(sample());
  mod(b);
  return decode_header(b.data(), kLimits).status();
}

TEST(Frame, RejectsMalformedHeaders) {
  Status s = decode_modified([](HeaderBytes& b) { b[0] = 'X'; });
  EXPECT_EQ(s.code(), Code::kProtocol);
  EXPECT_NE(s.message().find("magic"), std::string::npos);
  s = decode_modified([](HeaderBytes& b) { b[4] = 99; });
  EXPECT_NE(s.message().find("unknown frame type"), std::string::npos);
  s = decode_modified([](HeaderBytes& b) { b[7] = 1; });
  EXPECT_NE(s.message().find("reserved"), std::string::npos);
  s = decode_modified([](HeaderBytes& b) { b[13] = 1; });
  EXPECT_NE(s.message().find("reserved"), std::string::npos);
  s = decode_modified([](HeaderBytes& b) { put_u32(b.data() + 8, (1 << 20) + 1); });
  EXPECT_NE(s.message().find("limit"), std::string::npos);
  s = decode_modified([](HeaderBytes& b) { b[5] = 0x80; });
  EXPECT_NE(s.message().find("flags"), std::string::npos);
}

TEST(Frame, PayloadLimitsPerType) {
  FrameHeader h;
  h.type = FrameType::kEager;
  h.payload_len = (16 << 10) + 1;  // one over the eager limit
  EXPECT_FALSE(decode_header(encode_header(h).data(), kLimits).ok());
  h.payload_len = 16 << 10;
  EXPECT_TRUE(decode_header(encode_header(h).data(), kLimits).ok());
  h.type = FrameType::kRts;  // carries no payload at all
  h.payload_len = 1;
  EXPECT_FALSE(decode_header(encode_header(h).data(), kLimits).ok());
  h.type = FrameType::kAck;
  h.payload_len = kMaxControlPayload + 1;
  EXPECT_FALSE(decode_header(encode_header(h).data(), kLimits).ok());
}

TEST(Frame, PayloadPathByte) {
  FrameHeader h;
  h.type = FrameType::kSendData;
  h.path = 1;
  h.payload_len = 8;  // the path's descriptor, not the chunk
  auto d = decode_header(encode_header(h).data(), kLimits);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->path, 1);
  h.payload_len = kMaxPathDescriptor + 1;
  EXPECT_NE(decode_header(encode_header(h).data(), kLimits).status().message().find("limit"), std::string::npos);
  h.payload_len = 8;
  h.path = kMaxPathId + 1;
  EXPECT_NE(decode_header(encode_header(h).data(), kLimits).status().message().find("at most"), std::string::npos);
  h.type = FrameType::kWriteData;
  h.path = kMaxPathId;
  h.flags = kFlagNotify;
  EXPECT_TRUE(decode_header(encode_header(h).data(), kLimits).ok());
  h.flags = kFlagNotify | kFlagVector;  // a vectored write's chunk
  EXPECT_TRUE(decode_header(encode_header(h).data(), kLimits).ok());
  h.flags = kFlagMore;  // only a vectored READ_REQ says more segments follow
  EXPECT_NE(decode_header(encode_header(h).data(), kLimits).status().message().find("unknown flags"),
            std::string::npos);
  h.flags = 32;
  EXPECT_NE(decode_header(encode_header(h).data(), kLimits).status().message().find("unknown flags"),
            std::string::npos);
  h.flags = 0;
  h.type = FrameType::kEager;  // an eager message may go by a path (the receiver copies it out)
  EXPECT_TRUE(decode_header(encode_header(h).data(), kLimits).ok());
  h.payload_len = kMaxPathDescriptor + 1;
  EXPECT_FALSE(decode_header(encode_header(h).data(), kLimits).ok());
  h.payload_len = 8;
  h.type = FrameType::kRts;  // control frames name no path
  EXPECT_NE(decode_header(encode_header(h).data(), kLimits).status().message().find("names payload path"),
            std::string::npos);
  auto bytes = encode_header(h);
  bytes[6] = 0;
  bytes[7] = 1;  // reserved
  EXPECT_FALSE(decode_header(bytes.data(), kLimits).ok());
  FrameHeader pd;
  pd.type = FrameType::kPathDone;
  pd.id = 9;
  EXPECT_TRUE(decode_header(encode_header(pd).data(), kLimits).ok());
  pd.payload_len = 1;
  EXPECT_FALSE(decode_header(encode_header(pd).data(), kLimits).ok());
}

// A TABLE chunk (docs/wire.md "Tables"): a vectored WRITE_DATA by a path, a0 pieces (1 to 1,024),
// a1 0, the table (20 B a piece) and a descriptor of at most kMaxTableDescriptor bytes; no
// CHECKSUM. A READ_DATA by a path may be one too, with a2 pieces.
TEST(Frame, TableChunk) {
  auto table = [](uint64_t n, uint32_t payload) {
    FrameHeader h;
    h.type = FrameType::kWriteData;
    h.flags = kFlagVector | kFlagTable | kFlagNotify;
    h.path = 3;
    h.id = 77;
    h.a0 = n;
    h.a2 = 1 << 20;
    h.a3 = 5;
    h.payload_len = payload;
    return h;
  };
  auto decode = [](const FrameHeader& h) { return decode_header(encode_header(h).data(), kLimits); };
  for (uint64_t n : {1u, 2u, 127u, kMaxTableEntries}) {
    for (uint32_t payload : {static_cast<uint32_t>(n) * kTableEntrySize + 1,
                             static_cast<uint32_t>(n) * kTableEntrySize + kMaxTableDescriptor}) {
      auto d = decode(table(n, payload));
      ASSERT_TRUE(d.ok()) << n << " " << payload << ": " << d.status().to_string();
      EXPECT_EQ(d->flags, kFlagVector | kFlagTable | kFlagNotify);
      EXPECT_EQ(d->a0, n);
      EXPECT_EQ(d->path, 3);
      EXPECT_EQ(d->payload_len, payload);
    }
  }
  EXPECT_EQ(kMaxTablePayload, kMaxTableEntries * kTableEntrySize + kMaxTableDescriptor);
  EXPECT_TRUE(decode(table(kMaxTableEntries, kMaxTablePayload)).ok());
  auto refused = [&](const FrameHeader& h, const char* words) {
    auto d = decode(h);
    if (d.ok()) return ::testing::AssertionFailure() << "accepted: " << describe(h);
    if (d.status().code() != Code::kProtocol || d.status().message().find(words) == std::string::npos)
      return ::testing::AssertionFailure() << d.status().to_string();
    return ::testing::AssertionSuccess();
  };
  FrameHeader h = table(4, 100);
  h.flags = kFlagTable;  // not VECTOR
  EXPECT_TRUE(refused(h, "be VECTOR if a write"));
  // Inline (path 0, version 11): the table, then at least a byte a piece, within a chunk's limit.
  auto inline_table = [&](uint64_t n, uint32_t payload) {
    FrameHeader t = table(n, payload);
    t.path = 0;
    return t;
  };
  for (uint64_t n : {1u, 2u, kMaxTableEntries}) {
    for (uint32_t payload : {static_cast<uint32_t>(n) * (kTableEntrySize + 1), kLimits.max_chunk}) {
      auto d = decode(inline_table(n, payload));
      ASSERT_TRUE(d.ok()) << n << " " << payload << ": " << d.status().to_string();
      EXPECT_EQ(d->path, 0);
      EXPECT_EQ(d->payload_len, payload);
    }
  }
  EXPECT_TRUE(refused(inline_table(4, 4 * kTableEntrySize + 3), "an inline TABLE chunk of 4 pieces carries 83"));
  EXPECT_TRUE(refused(inline_table(4, 80), "an inline TABLE chunk"));
  EXPECT_TRUE(refused(inline_table(4, 0), "an inline TABLE chunk"));
  EXPECT_TRUE(refused(inline_table(4, kLimits.max_chunk + 1), "the limit is"));
  EXPECT_TRUE(refused(inline_table(UINT64_MAX, 5000), "pieces"));
  h = inline_table(4, 100);
  h.flags = kFlagTable;
  EXPECT_TRUE(refused(h, "be VECTOR if a write"));
  h = table(4, 100);
  h.flags |= kFlagChecksum;
  h.crc = 0x1234;
  EXPECT_TRUE(refused(h, "no CHECKSUM"));
  EXPECT_TRUE(refused(table(0, 100), "a TABLE chunk of 0 pieces"));
  EXPECT_TRUE(refused(table(kMaxTableEntries + 1, 5000), (std::to_string(kMaxTableEntries + 1) + " pieces").c_str()));
  EXPECT_TRUE(refused(table(UINT64_MAX, 5000), "pieces"));  // a0 * 20 must not wrap
  h = table(4, 100);
  h.a1 = 1;
  EXPECT_TRUE(refused(h, "a1 1 must be 0"));
  EXPECT_TRUE(refused(table(4, 80), "no room for a descriptor"));  // the table alone
  EXPECT_TRUE(refused(table(4, 79), "no room for a descriptor"));
  EXPECT_TRUE(refused(table(4, 0), "no room for a descriptor"));
  EXPECT_TRUE(refused(table(4, 4 * kTableEntrySize + kMaxTableDescriptor + 1), "the limit is"));
  EXPECT_TRUE(refused(table(kMaxTableEntries, kMaxTablePayload + 1), "the limit is"));
  // READ_DATA: a2 pieces; a0 and a1 are the first piece's offset and the read's length.
  auto read = [&](uint64_t n, uint32_t payload) {
    FrameHeader r = table(0, payload);
    r.type = FrameType::kReadData;
    r.flags = kFlagTable;
    r.a0 = 12345;
    r.a1 = 1 << 30;
    r.a2 = n;
    r.a3 = 0;
    return r;
  };
  for (uint64_t n : {1u, kMaxTableEntries}) {
    auto d = decode(read(n, static_cast<uint32_t>(n) * kTableEntrySize + 9));
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_EQ(table_pieces(*d), n);
    EXPECT_EQ(d->a0, 12345u);
  }
  EXPECT_TRUE(refused(read(0, 100), "a TABLE chunk of 0 pieces"));
  EXPECT_TRUE(refused(read(kMaxTableEntries + 1, 5000), "pieces"));
  EXPECT_TRUE(refused(read(4, 80), "no room for a descriptor"));
  // Inline (path 0, version 12): as a write's, the table and at least a byte a piece.
  auto inline_read = [&](uint64_t n, uint32_t payload) {
    FrameHeader r = read(n, payload);
    r.path = 0;
    return r;
  };
  for (uint64_t n : {1u, kMaxTableEntries}) {
    auto d = decode(inline_read(n, static_cast<uint32_t>(n) * (kTableEntrySize + 1)));
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_EQ(inline_table_bytes(*d), n * kTableEntrySize);
  }
  EXPECT_TRUE(refused(inline_read(4, 83), "an inline TABLE chunk of 4 pieces carries 83"));
  EXPECT_TRUE(refused(inline_read(4, kLimits.max_chunk + 1), "the limit is"));
  EXPECT_TRUE(refused(inline_read(UINT64_MAX, 5000), "pieces"));
  h = inline_read(4, 100);
  h.flags |= kFlagChecksum;
  h.crc = 0x1234;
  EXPECT_TRUE(refused(h, "no CHECKSUM"));
  EXPECT_EQ(inline_table_bytes(read(4, 100)), 0u);  // by a path: the descriptor follows, no bytes
  h = read(4, 100);
  h.flags |= kFlagVector;  // VECTOR is a write's and a READ_REQ's
  EXPECT_TRUE(refused(h, "unknown flags"));
  // READ_REQ: a0 segments, their entries and nothing else; VECTOR; a1 and a2 0.
  auto req = [&](uint64_t n, uint32_t payload) {
    FrameHeader r;
    r.type = FrameType::kReadReq;
    r.flags = kFlagVector | kFlagTable | kFlagMore;
    r.id = 9;
    r.a0 = n;
    r.a3 = 6;
    r.payload_len = payload;
    return r;
  };
  for (uint64_t n : {1u, 77u, kMaxTableEntries}) {
    auto d = decode(req(n, static_cast<uint32_t>(n) * kTableEntrySize));
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_EQ(d->a0, n);
    EXPECT_EQ(d->payload_len, n * kTableEntrySize);
  }
  EXPECT_TRUE(refused(req(0, 0), "READ_REQ table of 0 segments"));
  EXPECT_TRUE(refused(req(kMaxTableEntries + 1, (kMaxTableEntries + 1) * kTableEntrySize), "segments"));
  EXPECT_TRUE(refused(req(4, 81), "carries 81 bytes, not 80"));
  EXPECT_TRUE(refused(req(4, 79), "carries 79 bytes"));
  h = req(4, 80);
  h.flags = kFlagTable;
  EXPECT_TRUE(refused(h, "READ_REQ table"));
  h = req(4, 80);
  h.a2 = 1;
  EXPECT_TRUE(refused(h, "READ_REQ table"));
  h = req(4, 80);
  h.flags &= static_cast<uint8_t>(~kFlagTable);  // a plain vectored READ_REQ carries nothing
  EXPECT_TRUE(refused(h, "the limit is 0"));
  // No other frame carries a table.
  for (FrameType t : {FrameType::kSendData, FrameType::kEager}) {
    h = table(4, 100);
    h.type = t;
    h.flags = kFlagVector | kFlagTable;
    EXPECT_TRUE(refused(h, "unknown flags")) << frame_type_name(t);
  }
}

// Bytes 12-15 carry a chunk's CRC32C exactly when the checksum flag is set, on data frames and
// EAGER only; otherwise they are reserved.
TEST(Frame, ChecksumFlagAndField) {
  for (FrameType t : {FrameType::kSendData, FrameType::kWriteData, FrameType::kReadData, FrameType::kEager}) {
    FrameHeader h;
    h.type = t;
    h.payload_len = 8;
    h.flags = kFlagChecksum;
    h.crc = 0xE3069283u;
    auto d = decode_header(encode_header(h).data(), kLimits);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_EQ(d->crc, 0xE3069283u);
    EXPECT_EQ(d->flags, kFlagChecksum);
    EXPECT_NE(describe(*d).find("crc32c=e3069283"), std::string::npos) << describe(*d);
    h.flags = 0;  // a CRC without the flag: the field is reserved
    EXPECT_NE(decode_header(encode_header(h).data(), kLimits).status().message().find("reserved"), std::string::npos);
  }
  FrameHeader rts;
  rts.type = FrameType::kRts;
  rts.flags = kFlagChecksum;
  EXPECT_NE(decode_header(encode_header(rts).data(), kLimits).status().message().find("unknown flags"),
            std::string::npos);
}

Hello sample_hello() {
  Hello h;
  h.version = kProtocolVersion;
  h.role = Role::kServer;
  h.streams = 8;
  h.chunk_size = 1 << 20;
  h.eager_limit = 16 << 10;
  h.unexpected_budget = 64 << 20;
  h.offers = {Offer{"shm", {1}}, Offer{"devmem", {1, 0}}};
  h.session = 77;
  h.nonce[0] = 1;
  h.proof[31] = 2;
  h.boot_id = "0b5d8a3e-6a0f-4d0f-9b65-1c2f6f1f7e11";
  h.hostname = "gpu-node-7";
  h.pid = 4242;
  h.peer_timeout_ms = 10000;
  h.local_channel = "@dmx-side-channel";
  h.checksum = static_cast<uint8_t>(Checksum::kCrc32c);
  h.name = "job-1/worker-3";
  h.epoch = 0x0123456789abcdefULL;
  return h;
}

TEST(Handshake, HelloRoundTrip) {
  Hello h = sample_hello();
  auto bytes = encode_hello(h);
  auto d = decode_hello(bytes.data(), bytes.size());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->streams, 8);
  EXPECT_EQ(d->session, 77u);
  EXPECT_EQ(d->nonce, h.nonce);
  EXPECT_EQ(d->proof, h.proof);
  EXPECT_EQ(d->boot_id, h.boot_id);
  EXPECT_EQ(d->hostname, h.hostname);
  EXPECT_EQ(d->pid, 4242u);
  ASSERT_EQ(d->offers.size(), 2u);
  EXPECT_EQ(d->offers[1].name, "devmem");
  EXPECT_EQ(d->offers[1].descriptor, (std::vector<unsigned char>{1, 0}));
  ASSERT_NE(d->offer("shm"), nullptr);
  EXPECT_EQ(d->offer("tcp"), nullptr);
  EXPECT_EQ(d->checksum, static_cast<uint8_t>(Checksum::kCrc32c));
  EXPECT_EQ(d->name, h.name);
  EXPECT_EQ(d->epoch, h.epoch);
  {  // an unknown checksum is refused (the byte before the address count, multilink, name and epoch)
    auto odd = bytes;
    odd[odd.size() - 8 - 2 - h.name.size() - 3] = 2;
    EXPECT_NE(decode_hello(odd.data(), odd.size()).status().message().find("unknown checksum"), std::string::npos);
  }
  // An empty descriptor (found by fuzz_hello_join: copying zero bytes to an empty vector's null
  // data() is undefined).
  h.offers.push_back(Offer{"loop", {}});
  bytes = encode_hello(h);
  d = decode_hello(bytes.data(), bytes.size());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  ASSERT_NE(d->offer("loop"), nullptr);
  EXPECT_TRUE(d->offer("loop")->descriptor.empty());
}

// The fuzz lane's committed seeds (tests/fuzz/corpus, written by scripts/fuzz.sh --write-seeds)
// must decode at the current protocol version: a seed of an older version stops at the version
// check, and fuzz_hello_join then never reaches the fields behind it.
TEST(Handshake, FuzzSeedsSpeakTheCurrentVersion) {
  const char* base = std::getenv("DMX_TEST_FIXTURES");
  std::string dir = std::string(base ? base : "tests/fixtures") + "/../fuzz/corpus/hello_join/";
  for (const char* name : {"hello-client", "hello-server", "hello-insecure-min"}) {
    std::ifstream f(dir + name, std::ios::binary);
    ASSERT_TRUE(f) << "cannot open " << dir + name;
    std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    auto d = decode_hello(bytes.data(), bytes.size());
    ASSERT_TRUE(d.ok()) << name << ": " << d.status().to_string() << " (regenerate: scripts/fuzz.sh --write-seeds)";
    EXPECT_EQ(d->version, kProtocolVersion) << name;
  }
}

TEST(Handshake, AddressesAndMultilink) {
  Hello h = sample_hello();
  h.addresses = {"10.0.1.2", "fd00::2"};
  h.multilink = static_cast<uint8_t>(Multilink::kAuto);
  auto bytes = encode_hello(h);
  auto d = decode_hello(bytes.data(), bytes.size());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->addresses, h.addresses);
  EXPECT_EQ(d->multilink, 1);
  Hello client = sample_hello();
  client.multilink = 1;
  EXPECT_TRUE(multilink_agreed(client, h)) << "auto on both sides, the server lists an address";
  h.addresses.clear();
  EXPECT_FALSE(multilink_agreed(client, h));
  client.multilink = static_cast<uint8_t>(Multilink::kOn);
  EXPECT_TRUE(multilink_agreed(client, h));
  h.multilink = 0;
  EXPECT_FALSE(multilink_agreed(client, h)) << "either side may refuse";
  // Hostile: not an address, too many, an unknown mode.
  Hello bad = sample_hello();
  bad.addresses = {"10.0.1.2; rm -rf"};
  auto b = encode_hello(bad);
  EXPECT_FALSE(decode_hello(b.data(), b.size()).ok());
  bad.addresses.assign(kMaxAddresses + 1, "10.0.0.1");
  b = encode_hello(bad);
  EXPECT_FALSE(decode_hello(b.data(), b.size()).ok());
  bad.addresses.clear();
  bad.multilink = 3;
  b = encode_hello(bad);
  EXPECT_FALSE(decode_hello(b.data(), b.size()).ok());
}

TEST(Handshake, EveryTruncationIsAnError) {
  auto bytes = encode_hello(sample_hello());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto d = decode_hello(bytes.data(), n);
    ASSERT_FALSE(d.ok()) << "accepted a HELLO cut to " << n << " bytes";
    EXPECT_EQ(d.status().code(), Code::kProtocol);
  }
  bytes.push_back(0);
  EXPECT_NE(decode_hello(bytes.data(), bytes.size()).status().message().find("trailing"), std::string::npos);
}

TEST(Handshake, FieldValidation) {
  auto check = [](void (*mod)(Hello&), const char* expect) {
    Hello h = sample_hello();
    mod(h);
    auto bytes = encode_hello(h);
    auto d = decode_hello(bytes.data(), bytes.size());
    ASSERT_FALSE(d.ok()) << expect;
    EXPECT_NE(d.status().message().find(expect), std::string::npos) << d.status().message();
  };
  check([](Hello& h) { h.version = kProtocolVersion + 1; }, ("protocol " + std::to_string(kProtocolVersion + 1)).c_str());
  check([](Hello& h) { h.streams = 0; }, "stream count");
  check([](Hello& h) { h.streams = 65; }, "stream count");
  check([](Hello& h) { h.chunk_size = 100; }, "chunk size");
  check([](Hello& h) { h.chunk_size = 1u << 30; }, "chunk size");
  check([](Hello& h) { h.offers.push_back(h.offers[0]); }, "offered twice");
  check([](Hello& h) { h.offers[0].name = "Shm"; }, "[a-z0-9_]");
  check([](Hello& h) { h.offers[0].name = ""; }, "[a-z0-9_]");
  check([](Hello& h) { h.offers[0].name = std::string(kMaxOfferName + 1, 'a'); }, "too long");
  check([](Hello& h) { h.offers[0].descriptor.assign(kMaxOfferDescriptor + 1, 0); }, "descriptor");
  check([](Hello& h) { h.offers.resize(kMaxOffers + 1, Offer{"x", {}}); }, "transports offered");
  check([](Hello& h) { h.unexpected_budget = UINT64_MAX; }, "unexpected budget");
  check([](Hello& h) { h.hostname = std::string("a\nb"); }, "non-printable");
  check([](Hello& h) { h.hostname = std::string(300, 'x'); }, "too long");
}

TEST(Handshake, JoinValidation) {
  Join j;
  j.session = 5;
  j.index = 3;
  j.streams = 4;
  auto bytes = encode_join(j);
  auto d = decode_join(bytes.data(), bytes.size());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->index, 3);
  j.index = 4;  // index >= streams: a data socket (the listener checks the session agreed one)
  bytes = encode_join(j);
  d = decode_join(bytes.data(), bytes.size());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->index, 4);
  j.index = 4 + kMaxOffers;  // beyond any data socket
  bytes = encode_join(j);
  EXPECT_FALSE(decode_join(bytes.data(), bytes.size()).ok());
  j.streams = 1;  // one stream: index 1 is the data socket
  j.index = 1;
  bytes = encode_join(j);
  EXPECT_TRUE(decode_join(bytes.data(), bytes.size()).ok());
  j.streams = 0;
  bytes = encode_join(j);
  EXPECT_FALSE(decode_join(bytes.data(), bytes.size()).ok());
  j.streams = 4;
  j.index = 0;  // stream 0 never joins
  bytes = encode_join(j);
  EXPECT_FALSE(decode_join(bytes.data(), bytes.size()).ok());
  EXPECT_FALSE(decode_join(bytes.data(), 5).ok());
}

TEST(Fuzz, RandomBytesNeverCrash) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<unsigned char> buf(600);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    size_t n = rng() % buf.size();
    for (size_t k = 0; k < n; ++k) buf[k] = static_cast<unsigned char>(rng());
    if (n >= kHeaderSize) {
      if (i % 2) put_u32(buf.data(), kMagic);  // get past the magic half of the time
      accepted += decode_header(buf.data(), kLimits).ok();
    }
    accepted += decode_hello(buf.data(), n).ok();
    accepted += decode_join(buf.data(), n).ok();
  }
  // Mutations of a valid HELLO: single bytes flipped.
  auto good = encode_hello(sample_hello());
  for (size_t i = 0; i < good.size(); ++i) {
    auto b = good;
    b[i] ^= static_cast<unsigned char>(1 + rng() % 255);
    (void)decode_hello(b.data(), b.size());
  }
  SUCCEED() << accepted << " random inputs happened to be valid";
}

}  // namespace
}  // namespace dmx::wire
