// What the endpoint's files share and nothing else needs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "dmx/memory.h"
#include "dmx/status.h"

namespace dmx::endpoint {

// Per-message cost charged against the peer's unexpected budget (so empty messages count too).
inline constexpr uint64_t kEagerOverhead = 64;
// An Inbound whose total is not known yet.
inline constexpr uint64_t kUnknownTotal = UINT64_MAX;
// Chunks one payload path may have in flight from this side.
inline constexpr size_t kPathWindow = 8;
// RxPlan::host_tag: what a landed frame's bytes were for.
enum HostTag : int { kTagNone = 0, kTagEagerMatched, kTagEagerUnexpected, kTagCounted };

inline Status protocol(std::string text) { return Status(Code::kProtocol, std::move(text)); }

// A buffer an operation may use: not null when it has bytes, and memory this process can reach.
inline Status region_problem(const MemRegion& r, std::string_view what) {
  if (r.size > 0 && r.ptr == nullptr) return Status(Code::kInvalidArgument, std::string(what) + ": null buffer");
  return mem_available(r.where);
}

}  // namespace dmx::endpoint
