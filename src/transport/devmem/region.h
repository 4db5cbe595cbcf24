// Memory bound to a NIC for devmem TCP: the dmabuf export and the netlink binding, together.
//
// One BoundRegion per registration. It owns, in this order of release: the binding (closing its
// netlink socket unbinds; the kernel drops its own dmabuf reference once in-flight buffers are
// back), then the exported dmabuf fd. The memory itself is the caller's and must outlive the
// BoundRegion. Thread-safety: immutable after creation.
#pragma once

#include <functional>
#include <memory>
#include <span>

#include "memory/dmabuf.h"
#include "transport/devmem/kernel.h"
#include "transport/devmem/rx.h"
#include "transport/devmem/tx.h"

namespace dmx::devmem {

// How memory becomes a dmabuf: export_dmabuf (CUDA) in production, a memfd-backed stand-in in
// tests.
using DmabufExporter = std::function<Result<DmabufExport>(MemRegion)>;

class BoundRegion {
 public:
  static Result<std::unique_ptr<BoundRegion>> bind_rx(NetlinkOps& ops, int ifindex, std::span<const uint32_t> queues,
                                                      MemRegion memory, const DmabufExporter& exporter = export_dmabuf);
  static Result<std::unique_ptr<BoundRegion>> bind_tx(NetlinkOps& ops, int ifindex, MemRegion memory,
                                                      const DmabufExporter& exporter = export_dmabuf);

  uint32_t id() const { return binding_->id(); }
  // Where `memory` sits in the dmabuf, for the receive path's bounds checks.
  RxPool rx_pool() const { return RxPool{id(), dmabuf_.offset, memory_}; }
  // For TX, offsets are dmabuf offsets: memory byte i is dmabuf byte tx_offset(i).
  TxBindingInfo tx_info() const { return TxBindingInfo{id(), dmabuf_.size}; }
  uint64_t tx_offset(uint64_t memory_offset) const { return dmabuf_.offset + memory_offset; }
  MemRegion memory() const { return memory_; }

 private:
  BoundRegion(MemRegion memory, DmabufExport dmabuf, std::unique_ptr<Binding> binding)
      : memory_(memory), dmabuf_(std::move(dmabuf)), binding_(std::move(binding)) {}
  MemRegion memory_;
  DmabufExport dmabuf_;               // released after the binding (declaration order)
  std::unique_ptr<Binding> binding_;
};

}  // namespace dmx::devmem
