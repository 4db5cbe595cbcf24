// A machine's placement for devmem's tests (landing_test.cc, engine/devmem_engine_test.cc): the
// dual-socket-icelake fixture whose GPU pools are page-aligned host memory, standing for
// cudaMalloc's arenas (the kernel double's RX pool and ring are host memory), counted; and what the
// placement's books hold for an owner.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "topo/p2pmem_double.h"
#include "topo/placement.h"
#include "topo/topo_fixture.h"

namespace dmx::devmem::testing {

struct HostArenas {
  std::atomic<int> allocated{0}, freed{0};
  topo::DeviceMemory hook() {
    return topo::DeviceMemory{[this](int, uint64_t bytes) -> Result<void*> {
                                ++allocated;
                                void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
                                if (p == nullptr) return Status(Code::kResourceExhausted, "aligned_alloc");
                                return p;
                              },
                              [this](int, void* p, uint64_t) {
                                ++freed;
                                std::free(p);
                              }};
  }
  // The fixture's placement, its GPU pools 64 MiB each, drawing on these arenas.
  std::shared_ptr<topo::Placement> machine() {
    return topo::Placement::create(
        std::make_shared<const topo::Topology>(topo::testing::load("dual-socket-icelake")),
        std::make_shared<topo::testing::P2pmemDouble>(), hook(), 64 << 20);
  }
};

// What the placement's books hold for `owner`.
inline uint64_t held_by(const topo::Placement& p, const std::string& owner) {
  uint64_t n = 0;
  for (const auto& u : p.usage())
    if (auto it = u.owners.find(owner); it != u.owners.end()) n += it->second;
  return n;
}

// What the placement's books hold for owners starting with `prefix`.
inline uint64_t held(const topo::Placement& p, const std::string& prefix) {
  uint64_t n = 0;
  for (const auto& u : p.usage())
    for (const auto& [owner, bytes] : u.owners)
      if (owner.starts_with(prefix)) n += bytes;
  return n;
}

}  // namespace dmx::devmem::testing
