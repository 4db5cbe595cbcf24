// A devmem path's memory from the machine's placement, or its own (devmem.h: placement_memory,
// place_memory).
#include <fmt/format.h>
#include <unistd.h>

#include "core/log.h"
#include "core/units.h"
#include "topo/placement.h"
#include "transport/devmem/devmem.h"

namespace dmx::devmem {

std::string_view memory_use_name(MemoryUse use) {
  switch (use) {
    case MemoryUse::kRxPool:
      return "RX pool";
    case MemoryUse::kTxRing:
      return "TX ring";
    case MemoryUse::kZcrxArea:
      return "zcrx area";
    case MemoryUse::kLanding:
      return "landing zone";
  }
  return "?";
}

namespace {

std::string owner_of(MemoryUse use, const std::string& ifname, const std::string& peer) {
  return peer.empty() ? fmt::format("devmem {} of {}", memory_use_name(use), ifname)
                      : fmt::format("devmem {} of {} to {}", memory_use_name(use), ifname, peer);
}

uint64_t page_size() {
  long p = ::sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<uint64_t>(p) : 4096;
}

}  // namespace

std::function<Result<PlacedMemory>(MemoryUse, uint64_t, const std::string&)> placement_memory(
    PlacementSource placement, std::string ifname, int cuda_device, MemSpec as) {
  return [placement = std::move(placement), ifname = std::move(ifname), cuda_device, as](
             MemoryUse use, uint64_t bytes, const std::string& peer) -> Result<PlacedMemory> {
    DMX_ASSIGN_OR_RETURN(std::shared_ptr<topo::Placement> p, placement());
    std::string owner = owner_of(use, ifname, peer);
    // The memory the NIC is bound to is exported as a dma-buf of whole pages, all of it ours.
    uint64_t align = use == MemoryUse::kLanding ? topo::Orchestrator::kAlign : page_size();
    DMX_ASSIGN_OR_RETURN(topo::GpuBuffer b, p->allocate_nic_memory(ifname, cuda_device, bytes, owner, align));
    auto keep = std::make_shared<topo::GpuBuffer>(std::move(b));
    PlacedMemory m;
    m.region = MemRegion{keep->data(), bytes, as};
    m.where = fmt::format("GPU pool {} ({}, the pool nearest {} and cuda:{} by the P2PDMA rule; booked to \"{}\")",
                          keep->pool(), format_size(bytes), ifname, cuda_device, owner);
    m.keep = std::move(keep);
    return m;
  };
}

Result<PlacedMemory> place_memory(const HostSeams& seams, MemoryUse use, uint64_t bytes, const std::string& peer) {
  Result<PlacedMemory> m = Status(Code::kUnavailable, "these seams place nothing");
  if (seams.place) m = seams.place(use, bytes, peer);
  if (m.ok() && use != MemoryUse::kLanding && !(m->region.where == seams.memory))
    m = Status(Code::kInternal, fmt::format("the placement gave {} memory, and the {} must be in {}",
                                            to_string(m->region.where), memory_use_name(use), to_string(seams.memory)));
  if (m.ok() && m->region.size < bytes)
    m = Status(Code::kInternal, fmt::format("the placement gave {} bytes for {}", m->region.size, bytes));
  if (m.ok()) return m;
  // The path's own memory: the same memory, unbooked, so no slower path.
  std::string why = m.status().message();
  auto b = Buffer::allocate(seams.memory, bytes);
  if (!b.ok())
    return Status(b.status().code(), fmt::format("allocating the devmem {} ({} bytes in {}): {}; not placed: {}",
                                                 memory_use_name(use), bytes, to_string(seams.memory),
                                                 b.status().message(), why));
  if (seams.place)
    DMX_LOG_INFO("devmem {} of {}{}: not placed ({}); a buffer in {} instead", memory_use_name(use), seams.ifname,
                 peer.empty() ? std::string() : " to " + peer, why, to_string(seams.memory));
  auto keep = std::make_shared<Buffer>(std::move(*b));
  return PlacedMemory{keep->region(), keep,
                      fmt::format("a buffer in {} (not placed: {})", to_string(seams.memory), why)};
}

}  // namespace dmx::devmem
