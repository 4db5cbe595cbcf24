#include "transport/shm/shm_transport.h"

#include <fmt/format.h>

#include <mutex>

#include "transport/shm/control_pipe.h"
#include "transport/shm/shm_path.h"

namespace dmx {
namespace {

// Both descriptors are one version byte: nothing else needs agreeing.
constexpr unsigned char kVersion = 1;

Status same_host_only(std::string_view name, std::span<const unsigned char> a, std::span<const unsigned char> b,
                      const PeerPair& pair) {
  DMX_RETURN_IF_ERROR(same_version(name, a, b, kVersion));
  if (!pair.same_host) return Status(Code::kUnavailable, fmt::format("{} needs both ends on one host", name));
  return Status();
}

Result<std::vector<unsigned char>> shm_offer(std::string_view name) {
  Status s = shm::available();
  if (!s.ok()) return Status(Code::kUnavailable, s.message().starts_with("shm") ? s.message()
                                                                                : fmt::format("{}: {}", name, s.message()));
  return std::vector<unsigned char>{kVersion};
}

class ShmTransport final : public Transport {
 public:
  std::string_view name() const override { return "shm"; }
  TransportNeeds needs() const override { return {.side_channel = true}; }
  Result<std::vector<unsigned char>> offer(const Config& config) override {
    if (!transport_allowed(config, "shm"))
      return Status(Code::kUnavailable, fmt::format("shm: not asked (transport={})", config.get_string("transport")));
    return shm_offer("shm");
  }
  Status compatible(std::span<const unsigned char> a, std::span<const unsigned char> b,
                    const PeerPair& pair) const override {
    return same_host_only("shm", a, b, pair);
  }
  std::string role(const PeerPair&) const override { return "payloads go through shm"; }
  std::string when() const override {
    return "chosen between two processes of one host (same boot id and hostname) when both offer it and the side "
           "channel connects";
  }
  Result<TransportLink> connect(Bootstrap& b) override {
    DMX_ASSIGN_OR_RETURN(shm::LinkOptions options, shm::link_options(b.config()));
    options.crew = crew(options.copy_threads);
    DMX_ASSIGN_OR_RETURN(UnixChannel ch, b.side_channel());
    TransportLink link;
    DMX_ASSIGN_OR_RETURN(link.path, make_shm_path(std::move(ch), b.client(), options, b.deadline()));
    return link;
  }

 private:
  // One crew for every link of this context, made by the first link that needs one (its
  // configuration sets the size; the configuration is the context's).
  std::shared_ptr<CopyCrew> crew(int threads) {
    std::lock_guard lock(mu_);
    if (crew_ == nullptr) crew_ = CopyCrew::make(threads);
    return crew_;
  }

  std::mutex mu_;
  std::shared_ptr<CopyCrew> crew_;
};

class ShmPipeTransport final : public Transport {
 public:
  std::string_view name() const override { return "shm_pipe"; }
  TransportNeeds needs() const override { return {.side_channel = true}; }
  Result<std::vector<unsigned char>> offer(const Config& config) override {
    std::string forced = config.get_string("transport");
    if (forced == "tcp" || forced == "devmem")
      return Status(Code::kUnavailable, fmt::format("shm_pipe: not with transport={}", forced));
    if (!config.get_bool("control_pipe")) return Status(Code::kUnavailable, "shm_pipe: control_pipe is off");
    return shm_offer("shm_pipe");
  }
  Status compatible(std::span<const unsigned char> a, std::span<const unsigned char> b,
                    const PeerPair& pair) const override {
    return same_host_only("shm_pipe", a, b, pair);
  }
  Gives gives() const override { return Gives::kControl; }
  std::string role(const PeerPair&) const override { return "control stream on an shm pipe"; }
  std::string when() const override {
    return "between two processes of one host unless transport is tcp or devmem or control_pipe is off: stream 0 "
           "(control frames, path chunk headers, small inline payloads) runs on it instead of TCP";
  }
  std::string_view metric_name() const override { return "shm"; }
  Result<TransportLink> connect(Bootstrap& b) override {
    DMX_ASSIGN_OR_RETURN(UnixChannel ch, b.side_channel());
    TransportLink link;
    DMX_ASSIGN_OR_RETURN(link.control, make_control_pipe(std::move(ch), b.client(), b.deadline()));
    return link;
  }
};

}  // namespace

std::shared_ptr<Transport> make_shm_transport() { return std::make_shared<ShmTransport>(); }
std::shared_ptr<Transport> make_shm_pipe_transport() { return std::make_shared<ShmPipeTransport>(); }

}  // namespace dmx
