// handle.h — the 128 bytes NCCL carries from listen() to the peer's connect().
//
// Every field is checked on arrival (the bytes crossed NCCL's bootstrap). `stage` belongs to the
// connecting side: NCCL calls connect() again with the same handle memory until it returns a
// comm, so connect() keeps its connection job's token there (0: not started) — random, so that
// it cannot be guessed, and valid only with the nonce and address the job was started for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "plugins/nccl/nccl_abi.h"

namespace dmx::nccl {

inline constexpr uint32_t kHandleMagic = 0x4e584d44;  // "DMXN"
inline constexpr uint16_t kHandleVersion = 1;

struct Handle {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
  uint64_t nonce;     // the listener's secret; the connector sends it back first, so that a stray
                      // connection is not taken for this one
  uint64_t stage;     // connector only: its job's token
  char address[104];  // "tcp://host:port", NUL-terminated
};
static_assert(sizeof(Handle) == kHandleMaxSize);
static_assert(offsetof(Handle, nonce) == 8 && offsetof(Handle, stage) == 16 && offsetof(Handle, address) == 24);

// The address, when the handle is well formed; empty otherwise.
inline std::string handle_address(const Handle& h) {
  if (h.magic != kHandleMagic || h.version != kHandleVersion) return {};
  const void* end = std::memchr(h.address, '\0', sizeof h.address);
  if (end == nullptr) return {};
  std::string a(h.address);
  if (a.rfind("tcp://", 0) != 0) return {};
  for (char c : a)
    if (c < 0x21 || c > 0x7e) return {};
  return a;
}

}  // namespace dmx::nccl
