// Helpers for engine tests: random data in any memory kind, and a connected endpoint pair.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "dmx/dmx.h"
#include "test_env.h"

namespace dmx::test {

inline std::vector<unsigned char> random_bytes(size_t n) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  std::vector<unsigned char> v(n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x = rng();
    std::memcpy(v.data() + i, &x, 8);
  }
  for (; i < n; ++i) v[i] = static_cast<unsigned char>(rng());
  return v;
}

// A buffer of `kind` filled with fresh random bytes; `data` keeps a host copy to compare with.
struct Filled {
  Buffer buf;
  std::vector<unsigned char> data;
};

inline Filled filled(MemSpec where, size_t n) {
  Filled f;
  auto b = Buffer::allocate(where, n);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  f.buf = std::move(*b);
  f.data = random_bytes(n);
  if (n > 0) {
    EXPECT_TRUE(copy_memory(f.buf.region(), MemRegion{f.data.data(), n, {}}).ok());
  }
  return f;
}

// A buffer of `kind` filled with a poison pattern (so unwritten bytes show).
inline Buffer poisoned(MemSpec where, size_t n) {
  auto b = Buffer::allocate(where, n);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  if (n > 0) {
    std::vector<unsigned char> p(n, 0xA5);
    EXPECT_TRUE(copy_memory(b->region(), MemRegion{p.data(), n, {}}).ok());
  }
  return std::move(*b);
}

inline std::vector<unsigned char> read_back(const MemRegion& r) {
  std::vector<unsigned char> out(r.size);
  if (r.size > 0) {
    EXPECT_TRUE(copy_memory(MemRegion{out.data(), r.size, {}}, r).ok());
  }
  return out;
}

struct Pair {
  Context ctx;
  Listener listener;
  Endpoint client, server;
};

inline Options test_options(int streams = 4) {
  Options o;
  o.set("auth_key", "dmx-test-key-0123456789").set("streams", std::to_string(streams)).set("log_level", "warn");
  return o;
}

inline Pair connect_pair(const Options& o = test_options()) {
  Pair p;
  auto ctx = Context::create(o);
  EXPECT_TRUE(ctx.ok()) << ctx.status().to_string();
  p.ctx = *ctx;
  auto l = p.ctx.listen("tcp://127.0.0.1:0");
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  p.listener = std::move(*l);
  auto c = p.ctx.connect(p.listener.address());
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  p.client = std::move(*c);
  auto s = p.listener.accept(kEventually);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  p.server = std::move(*s);
  return p;
}

// Message i goes client->server (out_c[i] into in_s[i]) and server->client (out_s[i] into in_c[i]),
// all receives posted first, all sends at once, tag i; every byte is checked.
inline void exchange_both_ways(Endpoint& client, Endpoint& server, const std::vector<Filled>& out_c,
                               const std::vector<Filled>& out_s,
                               const std::vector<Buffer>& in_c, const std::vector<Buffer>& in_s,
                               std::chrono::seconds timeout) {
  std::vector<Request> reqs;
  for (size_t i = 0; i < out_c.size(); ++i) {
    reqs.push_back(server.recv(in_s[i].region(), i));
    reqs.push_back(client.recv(in_c[i].region(), i));
  }
  for (size_t i = 0; i < out_c.size(); ++i) {
    reqs.push_back(client.send(out_c[i].buf.region(), i));
    reqs.push_back(server.send(out_s[i].buf.region(), i));
  }
  for (auto& r : reqs) ASSERT_TRUE(r.wait(timeout).ok()) << r.status().to_string();
  for (size_t i = 0; i < out_c.size(); ++i) {
    ASSERT_EQ(read_back(in_s[i].region()), out_c[i].data) << i;
    ASSERT_EQ(read_back(in_c[i].region()), out_s[i].data) << i;
  }
}

// `r` received into `dst` the message of `tag` whose send was cancelled (ended kCancelled). It
// ends kCancelled once any byte of the message had gone out; if none had, the receiver put it back
// and it takes the next message of its tag (EndpointImpl::on_cancel), so it only looks like a
// hang. One more message of the tag tells which, and arrives byte-exact either way.
inline void expect_cancelled_or_put_back(Endpoint& from, Endpoint& to, Request& r, const MemRegion& dst,
                                         uint64_t tag, MemSpec where) {
  const auto limit = std::chrono::seconds(30);
  Filled next = filled(where, (5 << 20) + 1);
  Request sent = from.send(next.buf.region(), tag);
  Status rs = r.wait(limit);
  ASSERT_NE(rs.code(), Code::kTimeout) << "the receive of the cancelled message neither ended nor took the next";
  Request got = r;
  if (!rs.ok()) {
    EXPECT_EQ(rs.code(), Code::kCancelled) << rs.to_string();
    got = to.recv(dst, tag);
    ASSERT_TRUE(got.wait(limit).ok()) << got.status().to_string();
  }
  ASSERT_TRUE(sent.wait(limit).ok()) << sent.status().to_string();
  EXPECT_EQ(got.bytes(), next.data.size());
  EXPECT_EQ(read_back(dst.sub(0, next.data.size())), next.data);
}

}  // namespace dmx::test
