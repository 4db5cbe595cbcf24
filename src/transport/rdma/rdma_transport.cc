#include "transport/rdma/rdma_transport.h"

#include <fmt/format.h>

#include <mutex>

#include "core/log.h"
#include "topo/topology.h"
#include "transport/rdma/advice.h"
#include "transport/rdma/control_conduit.h"
#include "transport/rdma/device.h"
#include "transport/rdma/rdma_path.h"
#include "transport/rdma/registration.h"
#include "transport/rdma/wire.h"

namespace dmx {
namespace {

using rdma::Offer;

// rdma's and rdma_ctl's offer: the device, port, GID and MTU this side would use.
Result<std::vector<unsigned char>> offer_for(const Config& config, const rdma::Device& dev,
                                             const rdma::GpuRegistration& gpu) {
  Offer o;
  o.forced = config.get_string("transport") == "rdma";
  o.ethernet = dev.choice().ethernet;
  o.gpu_dmabuf = gpu.dmabuf;
  o.gpu_peermem = gpu.peermem;
  o.mtu = dev.choice().mtu;
  o.port = dev.choice().port;
  o.gid = dev.choice().gid;
  o.device = dev.choice().device;
  return o.encode();
}

// Symmetric: the same two descriptors give the same verdict on both sides.
Status compatible_offers(std::string_view name, std::span<const unsigned char> a, std::span<const unsigned char> b,
                         const PeerPair& pair) {
  DMX_ASSIGN_OR_RETURN(Offer x, Offer::decode(a));
  DMX_ASSIGN_OR_RETURN(Offer y, Offer::decode(b));
  if (x.ethernet != y.ethernet)
    return Status(Code::kUnavailable, fmt::format("{}: one side is RoCE ({}), the other InfiniBand ({})", name,
                                                  x.ethernet ? x.device : y.device, x.ethernet ? y.device : x.device));
  if (pair.same_host && !x.forced && !y.forced)
    return Status(Code::kUnavailable,
                  fmt::format("{} not used: both ends are on one host (set transport=rdma on a side to force it)", name));
  return Status();
}

// The device, opened on first use and kept for the context's life (its answer too when it fails).
class DeviceOnce {
 public:
  Result<std::shared_ptr<rdma::Device>> get(const Config& config) {
    std::lock_guard lock(mu_);
    if (!tried_) {
      tried_ = true;
      auto d = rdma::open_device(config);
      if (d.ok()) device_ = *d;
      else why_not_ = d.status();
    }
    if (!device_) return why_not_;
    return device_;
  }
  std::shared_ptr<rdma::Device> opened() const {
    std::lock_guard lock(mu_);
    return device_;
  }

 private:
  mutable std::mutex mu_;  // guards everything below
  bool tried_ = false;
  std::shared_ptr<rdma::Device> device_;
  Status why_not_;
};

class RdmaTransport final : public Transport {
 public:
  explicit RdmaTransport(RdmaTestHooks hooks) : hooks_(hooks), regions_(std::make_shared<rdma::RegionTable>()) {}

  std::string_view name() const override { return "rdma"; }
  TransportNeeds needs() const override { return {.data_socket = true}; }

  // Regions the user registers are registered with the NIC once per path that uses them, and
  // deregistered with them (registration.h).
  std::shared_ptr<void> attach_registration(const MemRegion& region) override {
    if (region.size == 0 || region.ptr == nullptr || region.where.kind == MemKind::kSim) return nullptr;
    return regions_->add(region);
  }

  Result<std::vector<unsigned char>> offer(const Config& config) override {
    if (!transport_allowed(config, "rdma"))
      return Status(Code::kUnavailable, fmt::format("rdma: not asked (transport={})", config.get_string("transport")));
    DMX_ASSIGN_OR_RETURN(auto dev, device_.get(config));
    return offer_for(config, *dev, gpu_for(config, *dev));
  }

  Status compatible(std::span<const unsigned char> a, std::span<const unsigned char> b,
                    const PeerPair& pair) const override {
    return compatible_offers("rdma", a, b, pair);
  }

  std::string role(const PeerPair&) const override {
    auto dev = device_.opened();
    std::lock_guard lock(mu_);
    return fmt::format("host memory{} goes by rdma (RDMA WRITE with immediate, small chunks by SEND, on {}; {}){}", gpu_.dmabuf || gpu_.peermem ? " and GPU memory" : "",
                       dev ? dev->describe() : "no device", gpu_.why,
                       advice_.empty() ? "" : fmt::format(" (topology advisor: {})", advice_));
  }
  std::string when() const override {
    return "chosen between hosts when both peers have an RDMA device of one link layer (on one host shm and "
           "cuda_ipc come first; transport=rdma forces it); moves chunks by RDMA WRITE with immediate and small ones by SEND; docs/rdma.md";
  }

  Result<TransportLink> connect(Bootstrap& b) override {
    DMX_ASSIGN_OR_RETURN(auto dev, device_.get(b.config()));
    DMX_ASSIGN_OR_RETURN(UniqueFd fd, b.data_socket());
    const Config& c = b.config();
    rdma::Depths depths;
    depths.qps = static_cast<int>(std::clamp<int64_t>(c.get_int("rdma_qps"), 1, rdma::kMaxQps));
    depths.max_chunk = std::clamp<uint64_t>(c.get_size("rdma_chunk"), rdma::kMinChunk, rdma::kMaxChunk);
    DMX_ASSIGN_OR_RETURN(auto conn, rdma::connect_qps(dev, fd.get(), depths, b.peer(), b.deadline(), hooks_.conn_info));
    rdma::PathSetup s;
    s.device = dev;
    s.regions = regions_;
    s.gpu = gpu_for(c, *dev);
    s.connection = std::move(conn);
    s.socket = std::move(fd);
    s.peer = b.peer();
    s.tamper = hooks_.tamper;
    TransportLink link;
    link.path = rdma::make_rdma_path(std::move(s));
    DMX_LOG_INFO("rdma to {}: {}", b.peer(), link.path->describe());
    return link;
  }

 private:
  // How GPU memory is registered, with the advisor's word per GPU (read once per context).
  rdma::GpuRegistration gpu_for(const Config& config, const rdma::Device& dev) {
    std::lock_guard lock(mu_);
    if (gpu_tried_) return gpu_;
    gpu_tried_ = true;
    gpu_ = rdma::gpu_registration(config.get_string("rdma_gpu"));
    if (!gpu_.dmabuf && !gpu_.peermem) return gpu_;
    auto t = topo::discover_local(config.get_string("sysfs_root"));
    if (!t.ok() || !*t) {
      advice_ = fmt::format("topology unknown ({}), not consulted", t.ok() ? "none" : t.status().message());
      return gpu_;
    }
    auto a = rdma::advise_gpus(**t, dev.choice().device);
    if (!a.ok()) {
      advice_ = fmt::format("not consulted: {}", a.status().message());
      return gpu_;
    }
    for (const rdma::GpuAdvice& g : *a) {
      advice_ += fmt::format("{}cuda:{} {}: {}", advice_.empty() ? "" : "; ", g.ordinal,
                             g.direct ? "GPUDirect RDMA" : "staged through host memory by other paths", g.why);
      if (!g.direct) gpu_.staged.push_back(g.ordinal);
    }
    return gpu_;
  }

  const RdmaTestHooks hooks_;
  const std::shared_ptr<rdma::RegionTable> regions_;
  DeviceOnce device_;
  mutable std::mutex mu_;  // guards everything below
  bool gpu_tried_ = false;
  rdma::GpuRegistration gpu_;
  std::string advice_;
};

// Stream 0 by SENDs over one more RC queue pair (control_conduit.h): wherever rdma is agreed, a
// small message is one SEND that the stream's worker polls for, not a TCP segment.
class RdmaCtlTransport final : public Transport {
 public:
  std::string_view name() const override { return "rdma_ctl"; }
  TransportNeeds needs() const override { return {.data_socket = true}; }
  Gives gives() const override { return Gives::kControl; }
  std::string_view metric_name() const override { return "rdma"; }

  Result<std::vector<unsigned char>> offer(const Config& config) override {
    if (!transport_allowed(config, "rdma"))
      return Status(Code::kUnavailable,
                    fmt::format("rdma_ctl: not asked (transport={})", config.get_string("transport")));
    if (!config.get_bool("control_pipe")) return Status(Code::kUnavailable, "rdma_ctl: control_pipe is off");
    DMX_ASSIGN_OR_RETURN(auto dev, device_.get(config));
    return offer_for(config, *dev, rdma::GpuRegistration{});
  }
  Status compatible(std::span<const unsigned char> a, std::span<const unsigned char> b,
                    const PeerPair& pair) const override {
    return compatible_offers("rdma_ctl", a, b, pair);
  }
  std::string role(const PeerPair&) const override { return "control stream by SENDs over an RC queue pair"; }
  std::string when() const override {
    return "where rdma is chosen, unless control_pipe is off: stream 0 (control frames, path chunk headers, small "
           "inline payloads) runs by SEND over its own RC queue pair instead of TCP; docs/rdma.md";
  }
  Result<TransportLink> connect(Bootstrap& b) override {
    DMX_ASSIGN_OR_RETURN(auto dev, device_.get(b.config()));
    DMX_ASSIGN_OR_RETURN(UniqueFd fd, b.data_socket());
    DMX_ASSIGN_OR_RETURN(auto conn, rdma::connect_qps(dev, fd.get(), rdma::control_depths(), b.peer(), b.deadline()));
    TransportLink link;
    link.control = rdma::make_control_conduit(std::move(conn), std::move(fd), b.peer());
    return link;
  }

 private:
  DeviceOnce device_;
};

}  // namespace

std::shared_ptr<Transport> make_rdma_transport(RdmaTestHooks hooks) { return std::make_shared<RdmaTransport>(hooks); }
std::shared_ptr<Transport> make_rdma_ctl_transport() { return std::make_shared<RdmaCtlTransport>(); }

Status rdma_available(const Config& config) {
  auto d = rdma::open_device(config);
  return d.ok() ? Status() : d.status();
}

}  // namespace dmx
