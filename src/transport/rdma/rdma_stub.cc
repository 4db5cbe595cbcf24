// The rdma transport of a build without libibverbs (DMX_ENABLE_RDMA off): it is never offered, and
// says why (DMX_RDMA_REASON, from cmake/DmxRdma.cmake).
#include <fmt/format.h>

#include "transport/rdma/rdma_transport.h"

namespace dmx {
namespace {

constexpr const char* kWhy = "rdma: dmx was built " DMX_RDMA_REASON;

class RdmaStub final : public Transport {
 public:
  RdmaStub(std::string_view name, Gives gives) : name_(name), gives_(gives) {}
  std::string_view name() const override { return name_; }
  Gives gives() const override { return gives_; }
  Result<std::vector<unsigned char>> offer(const Config&) override { return Status(Code::kUnavailable, kWhy); }
  Status compatible(std::span<const unsigned char>, std::span<const unsigned char>, const PeerPair&) const override {
    return Status(Code::kUnavailable, kWhy);
  }
  std::string role(const PeerPair&) const override { return kWhy; }
  std::string when() const override { return std::string("never: ") + kWhy; }
  Result<TransportLink> connect(Bootstrap&) override { return Status(Code::kUnavailable, kWhy); }

 private:
  const std::string_view name_;
  const Gives gives_;
};

}  // namespace

std::shared_ptr<Transport> make_rdma_transport(RdmaTestHooks) { return std::make_shared<RdmaStub>("rdma", Gives::kPath); }
std::shared_ptr<Transport> make_rdma_ctl_transport() { return std::make_shared<RdmaStub>("rdma_ctl", Gives::kControl); }
Status rdma_available(const Config&) { return Status(Code::kUnavailable, kWhy); }
std::vector<Capability> probe_rdma(const std::string&, bool) { return {{"rdma.verbs", false, kWhy}}; }

}  // namespace dmx
