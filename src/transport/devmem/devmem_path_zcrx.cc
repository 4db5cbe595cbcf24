// The devmem path's zcrx receiver (see devmem_path_rx.h and zcrx.h): one io_uring and interface
// queue per path, its area a dma-buf of the path's own pool.
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>

#include "transport/devmem/devmem_path_rx.h"

namespace dmx::devmem {
namespace {

constexpr uint32_t kRefillEntries = 4096;  // refill ring entries (the kernel's maximum is 32768)
constexpr size_t kRefillBatch = 64;        // buffers given back per tail update (flushed before waits)

class ZcrxPathRx final : public PathRx {
 public:
  ZcrxPathRx(PlacedMemory area, DmabufExport dmabuf, std::unique_ptr<ZcrxKernel> k)
      : area_(std::move(area)), dmabuf_(std::move(dmabuf)), k_(std::move(k)) {}
  ~ZcrxPathRx() override { rx_.reset(); }  // buffers back, then the ring closes (unregisters)
  Status init(Gatherer* g, const std::string& peer) {
    ZcrxOptions o;
    o.refill_batch = kRefillBatch;
    o.peer = peer;
    DMX_ASSIGN_OR_RETURN(rx_, ZcrxRx::create(k_.get(), area_.region, g, o));
    return Status();
  }

  Status receive_some(MemRegion dst, size_t* got, Deadline d) override { return rx_->receive_some(dst, got, d); }
  Status finish(Deadline d) override { return rx_->finish(d); }
  Result<uint64_t> unclaimed() override { return rx_->unclaimed(); }
  Status reject_unexpected() override {
    auto n = rx_->unclaimed();
    if (!n.ok()) return n.status();
    return Status(Code::kProtocol, fmt::format("peer sent {} bytes more than it announced (held by zcrx)", *n));
  }
  pollfd ready_fd() const override { return k_->ready_fd(); }
  void counters(DevmemPathCounters* c) const override {
    const ZcrxStats& s = rx_->stats();
    c->gathers = s.gathers;
    c->zcrx_cqes = s.cqes;
    c->zcrx_bytes = s.bytes;
    c->zcrx_refills = s.refills;
    c->zcrx_refill_flushes = s.refill_flushes;
    c->zcrx_arms = s.rearms;
    c->zcrx_buffers_held = rx_->buffers_held();
  }

 private:
  PlacedMemory area_;       // declaration order = release order reversed: rx_, k_, dmabuf_, area_
  DmabufExport dmabuf_;
  std::unique_ptr<ZcrxKernel> k_;
  std::unique_ptr<ZcrxRx> rx_;
};

bool busy(const Status& s) {
  const std::string& m = s.message();
  return m.find(fmt::format("(errno {})", EEXIST)) != std::string::npos ||
         m.find(fmt::format("(errno {})", EBUSY)) != std::string::npos;
}

}  // namespace

Result<PathRxChoice> open_zcrx_path_rx(const HostSeams& seams, int fd, Gatherer* gatherer, const Config& config,
                                       const std::string& peer) {
  auto no = [](std::string why) { return Status(Code::kUnavailable, "zcrx: " + why); };
  if (!seams.zcrx) return no("these seams have no zcrx");
  if (seams.queues.empty()) return no("no RX queues (devmem_queues)");
  uint64_t size = std::max<uint64_t>(config.get_size("devmem_rx_pool") / 4096 * 4096, 1 << 20);
  auto area = place_memory(seams, MemoryUse::kZcrxArea, size, peer);
  if (!area.ok()) return no(area.status().message());
  auto e = seams.exporter(area->region);
  if (!e.ok()) return no(fmt::format("exporting the area as a dma-buf: {}", e.status().message()));
  // The kernel makes the whole dma-buf the area: it must be exactly our memory.
  if (e->offset != 0 || e->size != size)
    return no(fmt::format("the area's dma-buf covers {} bytes from {} bytes before it, not just the area", e->size,
                          e->offset));
  std::string held;
  for (uint32_t q : seams.queues) {
    auto k = seams.zcrx(seams.ifindex, q, fd, e->fd.get(), e->size, kRefillEntries);
    if (!k.ok()) {
      if (!busy(k.status())) return no(k.status().message());
      held = k.status().message();
      continue;  // a memory provider (devmem, another ifq) holds it: the next
    }
    std::string where = area->where;
    auto rx = std::make_unique<ZcrxPathRx>(std::move(*area), std::move(*e), std::move(*k));
    DMX_RETURN_IF_ERROR(rx->init(gatherer, peer));
    PathRxChoice c;
    c.queue = q;
    c.note = fmt::format("zcrx: queue {} of {}, {} MiB dma-buf area from {}, refill ring of {} (batches of {})", q,
                         seams.ifname, size >> 20, where, kRefillEntries, kRefillBatch);
    c.rx = std::move(rx);
    return c;
  }
  return no(fmt::format("no free queue: queues {}-{} of {} each have a memory provider (devmem, another zcrx "
                        "ifq, another process) ({})",
                        seams.queues.front(), seams.queues.back(), seams.ifname, held));
}

}  // namespace dmx::devmem
