#include "transport/tcp/tcp_transport.h"

#include <fmt/format.h>

#include <utility>

#include "transport/tcp/striping.h"

namespace dmx {
namespace {

// The descriptor is one version byte: the streams' own parameters travel in HELLO.
constexpr unsigned char kVersion = 1;

class TcpTransport final : public Transport {
 public:
  std::string_view name() const override { return "tcp"; }
  Result<std::vector<unsigned char>> offer(const Config& config) override {
    if (!transport_allowed(config, "tcp"))
      return Status(Code::kUnavailable, fmt::format("tcp: not asked (transport={})", config.get_string("transport")));
    return std::vector<unsigned char>{kVersion};
  }
  Status compatible(std::span<const unsigned char> a, std::span<const unsigned char> b,
                    const PeerPair&) const override {
    return same_version("tcp", a, b, kVersion);
  }
  Gives gives() const override { return Gives::kStreams; }
  std::unique_ptr<Striping> striping(StripingSetup setup) const override {
    return tcp::make_striping(std::move(setup));
  }
  std::string role(const PeerPair&) const override { return "inline on the TCP streams"; }
  std::string when() const override {
    return "always, unless transport names another: every chunk no other agreed transport carries, or whose memory "
           "kind the ranking gives to the streams first (engine/ranking.h), goes inline on the streams, striped over "
           "`streams` data streams when no path is agreed (one stream beside a path)";
  }
  Result<TransportLink> connect(Bootstrap&) override { return TransportLink{}; }
};

}  // namespace

std::shared_ptr<Transport> make_tcp_transport() {
  return std::make_shared<TcpTransport>();
}

}  // namespace dmx
