// Returning devmem RX tokens to the kernel (SO_DEVMEM_DONTNEED), batched.
//
// Tokens are merged into ranges when consecutive; each setsockopt carries at most 128 ranges and
// 1024 fragments (the kernel's limits; past them it returns early or fails with EINVAL). The call
// returns how many fragments the kernel freed, not 0; a shortfall means the kernel did not know
// some tokens (already freed or never handed out), which is counted, never silently ignored.
// Thread-safety: one owner thread.
#pragma once

#include <cstdint>
#include <vector>

#include "dmx/status.h"
#include "transport/devmem/kernel.h"
#include "transport/devmem/kernel_abi.h"

namespace dmx::devmem {

// Merges `tokens` (in the given order) into ranges and splits them into calls that respect the
// kernel limits. Pure; exposed for tests.
std::vector<std::vector<abi::DmabufToken>> plan_dontneed(const std::vector<uint32_t>& tokens);

struct TokenStats {
  uint64_t returned = 0;     // fragments the kernel confirmed freed
  uint64_t calls = 0;        // SO_DEVMEM_DONTNEED calls made
  uint64_t unknown = 0;      // tokens the kernel did not recognise (freed count short)
};

// Returns all `tokens` to the kernel. On a failed call the remaining tokens are still attempted,
// so a transient failure never leaks the rest; the first error is returned.
Status return_tokens(KernelSocket& sock, const std::vector<uint32_t>& tokens, TokenStats* stats);

}  // namespace dmx::devmem
