// The rdma transport of a build without libibverbs (DMX_ENABLE_RDMA off): it is never offered, and
// says why (DMX_RDMA_REASON, from cmake/DmxRdma.cmake).
#include <fmt/format.h>

#include "transport/rdma/rdma_transport.h"

namespace dmx {
namespace {

constexpr const char* kWhy = "rdma: dmx was built " DMX_RDMA_REASON;

class RdmaStub final : public Transport {
 public:
  std::string_view name() const override { return "rdma"; }
  Result<std::vector<unsigned char>> offer(const Config&) override { return Status(Code::kUnavailable, kWhy); }
  Status compatible(std::span<const unsigned char>, std::span<const unsigned char>, const PeerPair&) const override {
    return Status(Code::kUnavailable, kWhy);
  }
  std::string role(const PeerPair&) const override { return kWhy; }
  std::string when() const override { return std::string("never: ") + kWhy; }
  Result<TransportLink> connect(Bootstrap&) override { return Status(Code::kUnavailable, kWhy); }
};

}  // namespace

std::shared_ptr<Transport> make_rdma_transport(RdmaTestHooks) { return std::make_shared<RdmaStub>(); }
Status rdma_available(const Config&) { return Status(Code::kUnavailable, kWhy); }
std::vector<Capability> probe_rdma(const std::string&, bool) { return {{"rdma.verbs", false, kWhy}}; }

}  // namespace dmx
