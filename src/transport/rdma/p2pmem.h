// p2pmem for rdma (seed 004): memory of a PCI device's BAR that the kernel publishes for P2PDMA
// (<sysfs>/bus/pci/devices/<bdf>/p2pmem/), mapped from its allocator file and registered with the
// NIC, so that a peer's RDMA lands in that device's memory without touching host memory. Where the
// kernel refuses (no p2pmem published, the pool exhausted, ib_umem cannot pin P2PDMA pages, the
// host bridge not on the kernel's P2PDMA list) the reason is the kernel's errno at that step.
//
// The mapping is memory like any other to the engine: register it with the context (it travels as
// host memory; the rdma path registers it with ibv_reg_mr, which is where the kernel decides).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "dmx/status.h"
#include "transport/rdma/registration.h"

namespace dmx::rdma {

class P2pmemMapping {
 public:
  ~P2pmemMapping();
  void* data() const { return ptr_; }
  size_t size() const { return size_; }
  const std::string& device() const { return bdf_; }

 private:
  friend Result<std::unique_ptr<P2pmemMapping>> map_p2pmem(const std::string&, const std::string&, size_t);
  void* ptr_ = nullptr;
  size_t size_ = 0;
  std::string bdf_;
};

// Maps `size` bytes (rounded up to pages) of PCI device `bdf`'s published p2pmem.
// kUnavailable with the kernel's reason.
Result<std::unique_ptr<P2pmemMapping>> map_p2pmem(const std::string& sysfs_root, const std::string& bdf, size_t size);

// Registers the mapping for the NIC (local write, remote read); kUnavailable with the kernel's
// reason when ibv_reg_mr refuses P2PDMA pages.
Result<std::shared_ptr<Mr>> register_p2pmem(const std::shared_ptr<Pd>& pd, const P2pmemMapping& m);

}  // namespace dmx::rdma
