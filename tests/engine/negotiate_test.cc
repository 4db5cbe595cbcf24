// tcp is a registered transport: offered, accepted and agreed through the same calls as the others,
// and what decides the stream count and the session's reason when no path is agreed.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/config.h"
#include "engine/context_impl.h"
#include "engine/handshake.h"
#include "engine/paths.h"
#include "engine/test_util.h"
#include "engine/transport_setup.h"

namespace dmx::test {
namespace {

bool offers(const wire::Hello& h, std::string_view name) {
  return h.offer(name) != nullptr;
}

// Two HELLOs as the handshake makes them between two hosts: each side's offers, then the server
// keeps what it accepts (no side channel is tried: the same-host transports are incompatible).
struct Hellos {
  wire::Hello client, server;
  std::string why_not;
};

Hellos between_hosts(const ContextImpl& c, const ContextImpl& s) {
  Hellos h;
  h.client = make_hello(c, wire::Role::kClient);
  h.server = make_hello(s, wire::Role::kServer);
  h.server.boot_id = "another-host";
  offer_transports(c, &h.client, nullptr, &h.why_not);
  offer_transports(s, &h.server, nullptr, &h.why_not);
  SideChannels channels;
  accept_transports(s, h.client, &h.server, &channels, &h.why_not);
  return h;
}

// Two HELLOs of one host that both offer exactly `offers`.
Hellos offering(const ContextImpl& impl, std::vector<wire::Offer> offers) {
  Hellos h;
  h.client = make_hello(impl, wire::Role::kClient);
  h.server = make_hello(impl, wire::Role::kServer);
  h.client.offers = h.server.offers = std::move(offers);
  return h;
}

TEST(Negotiate, BetweenHostsTcpIsAgreedAndStripesOverTheDataStreams) {
  auto ctx = Context::create(test_options(6));
  ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
  const ContextImpl& impl = *ctx->impl();
  Hellos h = between_hosts(impl, impl);
  ASSERT_TRUE(offers(h.client, "tcp"));
  EXPECT_FALSE(offers(h.server, "shm")) << "shm needs one host";
  ASSERT_TRUE(offers(h.server, "tcp")) << h.why_not;
  auto s = negotiate(impl, h.client, h.server, "peer:1", h.why_not);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->transport, "tcp");
  ASSERT_EQ(s->agreed.size(), 1u);
  EXPECT_EQ(s->agreed[0]->gives(), Gives::kStreams);
  EXPECT_EQ(s->streams, wire::stream_sockets(6)) << "6 data streams and the control stream";
  EXPECT_NE(s->reason.find("auto: different hosts; every chunk inline on the TCP streams (6 data streams)"),
            std::string::npos)
      << s->reason;
}

TEST(Negotiate, BesideAPathTcpCarriesTheRestOnOneStream) {
  auto ctx = Context::create(test_options(6));
  ASSERT_TRUE(ctx.ok());
  const ContextImpl& impl = *ctx->impl();
  Hellos h = offering(impl, {wire::Offer{"shm", {1}}, wire::Offer{"tcp", {1}}});
  auto s = negotiate(impl, h.client, h.server, "peer:1", "");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->transport, "shm");
  ASSERT_EQ(s->agreed.size(), 2u);
  EXPECT_EQ(s->agreed[1]->name(), "tcp") << "path id 2: never on a chunk header (no path), refused if seen";
  EXPECT_EQ(s->streams, 1) << "path chunk headers keep their order on stream 0";
  EXPECT_NE(s->reason.find("payloads go through shm; the rest inline on stream 0"), std::string::npos) << s->reason;
}

TEST(Negotiate, TheTransportSettingNamesTcpLikeAnyOther) {
  auto only_tcp = Context::create(test_options().set("transport", "tcp"));
  ASSERT_TRUE(only_tcp.ok());
  auto shm_only = Context::create(test_options().set("transport", "shm"));
  ASSERT_TRUE(shm_only.ok());

  wire::Hello h = make_hello(*only_tcp->impl(), wire::Role::kClient);
  std::string why;
  offer_transports(*only_tcp->impl(), &h, nullptr, &why);
  ASSERT_EQ(h.offers.size(), 1u) << why;
  EXPECT_EQ(h.offers[0].name, "tcp");
  EXPECT_NE(why.find("shm: not asked (transport=tcp)"), std::string::npos) << why;

  h = make_hello(*shm_only->impl(), wire::Role::kClient);
  why.clear();
  offer_transports(*shm_only->impl(), &h, nullptr, &why);
  EXPECT_FALSE(offers(h, "tcp"));
  EXPECT_NE(why.find("tcp: not asked (transport=shm)"), std::string::npos) << why;
}

// One host, the client forced to tcp and the server on auto: both agree on tcp alone, on the
// client's data streams and a control stream, with no shm pipe.
TEST(Negotiate, ForcedTcpAgainstAnAutoServerOnOneHost) {
  auto server_ctx = Context::create(test_options(3));
  auto client_ctx = Context::create(test_options(3).set("transport", "tcp"));
  ASSERT_TRUE(server_ctx.ok() && client_ctx.ok());
  auto l = server_ctx->listen("tcp://127.0.0.1:0");
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  auto c = client_ctx->connect(l->address());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto s = l->accept(std::chrono::seconds(10));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  for (const Endpoint* ep : {&*c, &*s}) {
    EndpointStats st = ep->stats();
    EXPECT_EQ(st.transport, "tcp") << st.reason;
    EXPECT_EQ(st.streams, 4u) << "3 data streams and the control stream";
    EXPECT_EQ(st.reason.find("shm pipe"), std::string::npos) << st.reason;
  }
  EXPECT_NE(c->stats().reason.find("forced by configuration (transport=tcp)"), std::string::npos);
  EXPECT_NE(s->stats().reason.find("auto: same host; every chunk inline on the TCP streams (3 data streams)"),
            std::string::npos)
      << s->stats().reason;
  std::vector<unsigned char> src = random_bytes((3u << 20) + 5), dst(src.size(), 0xA5);
  Request r = s->recv(MemRegion{dst.data(), dst.size(), {}}, 1);
  Request w = c->send(MemRegion{src.data(), src.size(), {}}, 1);
  ASSERT_TRUE(w.wait(kEventually).ok()) << w.status().to_string();
  ASSERT_TRUE(r.wait(kEventually).ok()) << r.status().to_string();
  EXPECT_EQ(src, dst);
}

TEST(Negotiate, AgreementWithNothingThatCarriesPayloadIsRefused) {
  auto ctx = Context::create(test_options());
  ASSERT_TRUE(ctx.ok());
  const ContextImpl& impl = *ctx->impl();
  Hellos h = offering(impl, {wire::Offer{"shm_pipe", {1}}});
  auto s = negotiate(impl, h.client, h.server, "peer:1", "tcp: gone");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kUnavailable);
  EXPECT_NE(s.status().message().find("no transport that carries payload was agreed (tcp: gone)"), std::string::npos)
      << s.status().to_string();
}

// `dmx probe` lists the streams once and tcp among the transports, with its verdict.
TEST(Negotiate, ProbeListsTheStreamsAndTcpWithItsVerdict) {
  auto c = Config::resolve(Options().set("transport", "shm"));
  ASSERT_TRUE(c.ok());
  auto caps = probe_engine_paths(*c);
  auto find = [&](std::string_view name) {
    return std::find_if(caps.begin(), caps.end(), [&](const Capability& k) { return k.name == name; });
  };
  ASSERT_NE(find("engine.streams"), caps.end());
  EXPECT_TRUE(find("engine.streams")->available);
  auto tcp = find("engine.path.tcp");
  ASSERT_NE(tcp, caps.end());
  EXPECT_FALSE(tcp->available);
  EXPECT_NE(tcp->detail.find("tcp: not asked (transport=shm)"), std::string::npos) << tcp->detail;
  auto named_tcp = [](const Capability& k) { return k.name == "engine.path.tcp"; };
  EXPECT_EQ(std::count_if(caps.begin(), caps.end(), named_tcp), 1) << "listed once";
}

}  // namespace
}  // namespace dmx::test
