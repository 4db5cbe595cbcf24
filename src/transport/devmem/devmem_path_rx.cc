// The devmem path's receiver choice, and devmem RX behind PathRx (see devmem_path_rx.h).
#include "transport/devmem/devmem_path_rx.h"

#include <fmt/format.h>

#include <algorithm>

#include "transport/devmem/rx.h"
#include "transport/devmem/rx_binding.h"

namespace dmx::devmem {
namespace {

class DevmemPathRx final : public PathRx {
 public:
  DevmemPathRx(std::shared_ptr<SharedRxBinding> shared, std::unique_ptr<DevmemRx> rx)
      : shared_(std::move(shared)), rx_(std::move(rx)) {}
  ~DevmemPathRx() override { rx_.reset(); }  // returns every token before the binding may go

  Status receive_some(MemRegion dst, size_t* got, Deadline d) override { return rx_->receive_some(dst, got, d); }
  Status finish(Deadline d) override { return rx_->finish(d); }
  Result<uint64_t> unclaimed() override { return uint64_t{0}; }
  Status reject_unexpected() override { return rx_->reject_unexpected(); }
  pollfd ready_fd() const override { return {-1, 0, 0}; }
  void counters(DevmemPathCounters* c) const override {
    const auto& r = rx_->stats();
    c->fragments = r.frags;
    c->linear_bytes = r.linear_bytes;
    c->linear_chunks = r.linear_chunks;
    c->devmem_bytes = r.devmem_bytes;
    c->plain_calls = r.plain_calls;
    c->tokens_returned = r.tokens.returned;
    c->tokens_unknown = r.tokens.unknown;
    c->tokens_outstanding = rx_->outstanding_tokens();
    c->gathers = r.gathers;
  }

 private:
  std::shared_ptr<SharedRxBinding> shared_;  // outlives rx_ (declaration order)
  std::unique_ptr<DevmemRx> rx_;
};

std::string queue_text(const std::vector<uint32_t>& q) {
  return q.empty() ? "none" : fmt::format("{}-{}", q.front(), q.back());
}

Result<PathRxChoice> open_devmem_path_rx(const HostSeams& seams, KernelSocket* sock, Gatherer* gatherer,
                                         const Config& config, const std::string& peer) {
  uint64_t pool_size = std::max<uint64_t>(config.get_size("devmem_rx_pool") / 4096 * 4096, 1 << 20);
  DMX_ASSIGN_OR_RETURN(auto shared, acquire_rx_binding(seams, pool_size));
  RxOptions ro = rx_options(config);
  ro.peer = peer;
  // Never hold more than a quarter of the pool's pages in tokens (a fragment pins a page).
  ro.max_outstanding_frags =
      std::max<size_t>(1, std::min<size_t>(ro.max_outstanding_frags, shared->pool_size() / 4096 / 4));
  auto rx = DevmemRx::create(sock, shared->bound().rx_pool(), gatherer, ro);
  if (!rx.ok()) return Status(rx.status().code(), "receive side: " + rx.status().message());
  PathRxChoice c;
  c.note = fmt::format("devmem RX: queues {}, {} MiB pool (binding {}) from {}", queue_text(seams.queues),
                       shared->pool_size() >> 20, shared->bound().id(), shared->where());
  c.rx = std::make_unique<DevmemPathRx>(std::move(shared), std::move(*rx));
  return c;
}

}  // namespace

Result<PathRxChoice> open_path_rx(const HostSeams& seams, int fd, KernelSocket* sock, Gatherer* gatherer,
                                  const Config& config, const std::string& peer) {
  const std::string& mode = config.get_string("devmem_rx");
  std::string why_not;
  if (mode == "devmem") {
    why_not = "devmem_rx=devmem";
  } else {
    auto z = open_zcrx_path_rx(seams, fd, gatherer, config, peer);
    if (z.ok()) return z;
    if (mode == "zcrx")
      return Status(z.status().code(), fmt::format("devmem_rx=zcrx: {}", z.status().message()));
    why_not = z.status().message();
  }
  auto d = open_devmem_path_rx(seams, sock, gatherer, config, peer);
  if (!d.ok()) return Status(d.status().code(), fmt::format("{} (zcrx not used: {})", d.status().message(), why_not));
  d->note += fmt::format("; zcrx not used: {}", why_not);
  return d;
}

}  // namespace dmx::devmem
