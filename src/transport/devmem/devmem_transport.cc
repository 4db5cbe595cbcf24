#include "transport/devmem/devmem_transport.h"

#include <fmt/format.h>

#include "transport/devmem/devmem_path.h"

namespace dmx {
namespace {

// Descriptor: version, then 1 when this side is forced to devmem (transport=devmem).
constexpr unsigned char kVersion = 1;

class DevmemTransport final : public Transport {
 public:
  explicit DevmemTransport(DevmemPathFactory factory) : factory_(std::move(factory)) {}
  std::string_view name() const override { return "devmem"; }
  TransportNeeds needs() const override { return {.data_socket = true}; }
  Result<std::vector<unsigned char>> offer(const Config& config) override {
    if (!transport_allowed(config, "devmem"))
      return Status(Code::kUnavailable, fmt::format("devmem: not asked (transport={})", config.get_string("transport")));
    if (!factory_) {
      Status s = devmem_path_offer(config);
      if (!s.ok())
        return Status(Code::kUnavailable,
                      s.message().starts_with("devmem") ? s.message() : fmt::format("devmem: {}", s.message()));
    }
    unsigned char forced = config.get_string("transport") == "devmem" ? 1 : 0;
    return std::vector<unsigned char>{kVersion, forced};
  }
  // devmem between two processes of one host would run over loopback, which cannot carry it:
  // only when a side is forced to it (then both decide the same from the same two descriptors).
  Status compatible(std::span<const unsigned char> a, std::span<const unsigned char> b,
                    const PeerPair& pair) const override {
    if (a.size() != 2 || b.size() != 2 || a[0] != kVersion || b[0] != kVersion || a[1] > 1 || b[1] > 1)
      return Status(Code::kUnavailable, "devmem: the peers speak different versions of it");
    if (pair.same_host && a[1] == 0 && b[1] == 0)
      return Status(Code::kUnavailable,
                    "devmem not used: both ends are on one host (set transport=devmem on a side to force it)");
    return Status();
  }
  std::string role(const PeerPair&) const override {
    return fmt::format("device sources go by devmem on a dedicated data socket when the receiver's buffer accepts "
                       "it{}",
                       factory_ ? " (this side's devmem is a test double)" : "");
  }
  std::string when() const override {
    return "chosen when both peers offer it and are on different hosts (or a side is forced to it): payloads from "
           "device memory into buffers its gatherer writes go on a dedicated data socket, the rest inline; "
           "docs/devmem.md";
  }
  Result<TransportLink> connect(Bootstrap& b) override {
    DMX_ASSIGN_OR_RETURN(UniqueFd fd, b.data_socket());
    TransportLink link;
    if (factory_) {
      DMX_ASSIGN_OR_RETURN(link.path, factory_(std::move(fd), b.config(), b.peer()));
    } else {
      DMX_ASSIGN_OR_RETURN(link.path, make_devmem_path(std::move(fd), b.config(), b.peer(),
                                                       static_cast<int>(b.config().get_int("devmem_gpu"))));
    }
    return link;
  }

 private:
  DevmemPathFactory factory_;
};

}  // namespace

std::shared_ptr<Transport> make_devmem_transport(DevmemPathFactory factory) {
  return std::make_shared<DevmemTransport>(std::move(factory));
}

}  // namespace dmx
