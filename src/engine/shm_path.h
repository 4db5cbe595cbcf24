// The shm payload path (placeholder until written): see payload_path.h.
#pragma once

#include <memory>

#include "core/clock.h"
#include "core/config.h"
#include "engine/payload_path.h"
#include "transport/shm/shm.h"

namespace dmx {

// `creator`: this side makes the shared region (ShmLink::create) — the side that accepted the
// Unix connection; the other side maps it (ShmLink::accept).
Result<std::unique_ptr<PayloadPath>> make_shm_path(shm::UnixChannel channel, bool creator, const Config& config,
                                                   Deadline deadline);

}  // namespace dmx
