#include "transport/devmem/devmem_transport.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>

#include "transport/devmem/advice.h"
#include "transport/devmem/devmem_path.h"
#include "transport/devmem/rx_binding.h"
#include "transport/devmem/tx_regions.h"

namespace dmx {
namespace {

// Descriptor: version, then 1 when this side is forced to devmem (transport=devmem).
constexpr unsigned char kVersion = 1;

class DevmemTransport final : public Transport {
 public:
  explicit DevmemTransport(DevmemPathFactory factory) : factory_(std::move(factory)) {}
  std::string_view name() const override { return "devmem"; }
  TransportNeeds needs() const override { return {.data_socket = true}; }
  // Device memory registered for peers is also what large sends come from: bind it for TX once,
  // on first use (tx_regions.h).
  std::shared_ptr<void> attach_registration(const MemRegion& region) override {
    if (!region.where.is_device() || region.size == 0) return nullptr;
    return devmem::register_tx_region(region);
  }
  std::string data_socket_device(const Config& config) const override {
    return factory_ ? std::string() : config.get_string("devmem_ifname");
  }
  Result<std::vector<unsigned char>> offer(const Config& config) override {
    if (!transport_allowed(config, "devmem"))
      return Status(Code::kUnavailable, fmt::format("devmem: not asked (transport={})", config.get_string("transport")));
    unsigned char forced = config.get_string("transport") == "devmem" ? 1 : 0;
    if (!factory_) {
      Status s = devmem_path_offer(config);
      if (!s.ok())
        return Status(Code::kUnavailable,
                      s.message().starts_with("devmem") ? s.message() : fmt::format("devmem: {}", s.message()));
      // The NIC can do it; whether it pays here is the topology's question.
      DMX_RETURN_IF_ERROR(consult_advisor(config, forced != 0));
      // The RX queues must be ours: a queue another process bound answers EEXIST, and then the
      // next transport is offered, with that reason. Not where paths will receive by zcrx (one
      // ifq per path on those queues, which a devmem binding would hold).
      DMX_RETURN_IF_ERROR(choose_receiver(config));
    }
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
    std::lock_guard<std::mutex> lock(mu_);
    return fmt::format("device sources go by devmem on a dedicated data socket when the receiver's buffer accepts "
                       "it{}{}",
                       factory_ ? " (this side's devmem is a test double)" : "",
                       advice_.empty() ? "" : fmt::format(" (topology advisor: {})", advice_));
  }
  std::string when() const override {
    return "chosen when both peers offer it and are on different hosts (or a side is forced to it): payloads from "
           "device memory into buffers its gatherer writes go on a dedicated data socket, except from a GPU the "
           "topology advisor would stage for (the ranking puts the streams first), the rest inline; "
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
  // In auto mode, offers devmem only where the advisor favours NIC-direct access between the GPU
  // and the NIC; forced, offers it anyway. The topology is read once per context.
  Status consult_advisor(const Config& config, bool forced) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!tried_) {
      tried_ = true;
      auto t = topo::discover_local(config.get_string("sysfs_root"));
      topology_ = t.ok() ? *t : nullptr;
      if (!t.ok()) advice_ = fmt::format("topology unknown ({}), not consulted", t.status().message());
    }
    if (!topology_) return Status();
    int gpu = static_cast<int>(config.get_int("devmem_gpu"));
    auto a = devmem::advise(*topology_, devmem::gpu_device(*topology_, gpu), config.get_string("devmem_ifname"));
    if (!a.ok()) {
      advice_ = fmt::format("not consulted: {}", a.status().message());
      return Status();
    }
    advice_ = a->direct ? "NIC-direct favoured: " + a->why : "staging favoured, forced: " + a->why;
    if (a->direct || forced) return Status();
    return Status(Code::kUnavailable, fmt::format("devmem: the topology advisor favours staging through host memory "
                                                  "for cuda:{} and {} ({}); set transport=devmem to force it",
                                                  gpu, config.get_string("devmem_ifname"), a->why));
  }

  // devmem_rx: zcrx where possible (auto) or asked (zcrx), else the devmem RX binding, held now.
  Status choose_receiver(const Config& config) {
    const std::string& mode = config.get_string("devmem_rx");
    if (mode != "devmem") {
      Status z;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!zcrx_tried_) zcrx_ = devmem_zcrx_offer(config), zcrx_tried_ = true;
        z = zcrx_;
      }
      if (z.ok()) return Status();
      if (mode == "zcrx") return Status(Code::kUnavailable, "devmem: devmem_rx=zcrx, but " + z.message());
    }
    return hold_rx_binding(config);
  }

  // The process's RX binding (rx_binding.h), held from the first offer for as long as this
  // transport (its context) lives, so that endpoints come and go without rebinding the queues.
  Status hold_rx_binding(const Config& config) {
    std::lock_guard<std::mutex> lock(mu_);
    if (held_) return Status();
    auto seams = devmem::kernel_seams(config, static_cast<int>(config.get_int("devmem_gpu")));
    if (!seams.ok()) return Status(Code::kUnavailable, seams.status().message());
    uint64_t pool = std::max<uint64_t>(config.get_size("devmem_rx_pool") / 4096 * 4096, 1 << 20);
    auto b = devmem::acquire_rx_binding(*seams, pool);
    if (!b.ok())
      return Status(Code::kUnavailable, b.status().message().starts_with("devmem") ? b.status().message()
                                                                                 : "devmem: " + b.status().message());
    held_ = std::move(*b);
    return Status();
  }

  DevmemPathFactory factory_;
  std::shared_ptr<devmem::SharedRxBinding> held_;  // guarded by mu_
  mutable std::mutex mu_;  // guards tried_, topology_, advice_, held_, zcrx_tried_, zcrx_
  bool tried_ = false, zcrx_tried_ = false;
  Status zcrx_;  // devmem_zcrx_offer's answer, asked once
  std::shared_ptr<const topo::Topology> topology_;
  std::string advice_;
};

}  // namespace

std::shared_ptr<Transport> make_devmem_transport(DevmemPathFactory factory) {
  return std::make_shared<DevmemTransport>(std::move(factory));
}

}  // namespace dmx
