#include "transport/cuda_ipc/cuda_ipc_transport.h"

#include <fmt/format.h>

#include "transport/cuda_ipc/ipc_path.h"

namespace dmx {
namespace {

constexpr unsigned char kVersion = 1;

class CudaIpcTransport final : public Transport {
 public:
  std::string_view name() const override { return "cuda_ipc"; }
  // The side channel carries the fds of cuMem allocations (ipc_fds.h).
  TransportNeeds needs() const override { return {.side_channel = true}; }
  Result<std::vector<unsigned char>> offer(const Config& config) override {
    if (!transport_allowed(config, "cuda_ipc"))
      return Status(Code::kUnavailable, fmt::format("cuda_ipc: not asked (transport={})", config.get_string("transport")));
    Status s = cuda_ipc_path_available();
    if (!s.ok())
      return Status(Code::kUnavailable,
                    s.message().starts_with("cuda_ipc") ? s.message() : fmt::format("cuda_ipc: {}", s.message()));
    return std::vector<unsigned char>{kVersion};
  }
  Status compatible(std::span<const unsigned char> a, std::span<const unsigned char> b,
                    const PeerPair& pair) const override {
    DMX_RETURN_IF_ERROR(same_version("cuda_ipc", a, b, kVersion));
    if (!pair.same_host) return Status(Code::kUnavailable, "cuda_ipc needs both ends on one host");
    return Status();
  }
  Status admit(const PeerPair& pair, bool same_process) const override {
    if (!pair.same_pid) return Status();
    Status s = cuda_ipc_usable_between(pair.pid, pair.pid, same_process);
    return s.ok() ? s : Status(s.code(), fmt::format("cuda_ipc not used: {}", s.message()));
  }
  std::string role(const PeerPair& pair) const override {
    return pair.same_pid ? "device sources go by cuda_ipc (one process: it copies from the sender's own pointers)"
                         : "device sources go by cuda_ipc";
  }
  std::string when() const override { return "chosen between two processes of one host with CUDA; carries device sources"; }
  Result<TransportLink> connect(Bootstrap& b) override {
    // Within one process the path shares pointers: only when the kernel says so (a peer's HELLO
    // could claim our pid; the server checked the same in admit()).
    bool in_process = b.pair().same_pid;
    if (in_process && !b.same_process())
      return Status(Code::kProtocol, fmt::format("cuda_ipc was agreed within one process (pid {}), but no side "
                                                 "channel comes from this process",
                                                 b.pair().pid));
    DMX_ASSIGN_OR_RETURN(UnixChannel fds, b.side_channel());
    TransportLink link;
    DMX_ASSIGN_OR_RETURN(link.path, make_cuda_ipc_path(b.config(), b.peer(), in_process, std::move(fds)));
    return link;
  }
};

}  // namespace

std::shared_ptr<Transport> make_cuda_ipc_transport() { return std::make_shared<CudaIpcTransport>(); }

}  // namespace dmx
