// What the machine running the tests lacks.
//
// Skips: one wording per cause, "<cause>: <the precise reason>", so that a reader (and the summary
// at the end of scripts/test.sh, which counts skips by the text before the first ':') sees why.
// Use the macros below rather than writing a cause by hand.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "dmx/dmx.h"

namespace dmx::test {

// The causes. Each skip message starts with one of them and ": ".
inline constexpr const char* kNoGpu = "no CUDA device";           // mem_available(cuda:N) says why
inline constexpr const char* kFewGpus = "too few CUDA devices";    // needs more than are visible
inline constexpr const char* kHasGpu = "CUDA device present";      // a test of machines without one
inline constexpr const char* kOldKernel = "kernel lacks it";       // a netdev/devmem/zcrx feature
inline constexpr const char* kNoCapability = "not permitted";      // a capability or root
inline constexpr const char* kNotAgreed = "path not agreed";       // the pair chose another transport
inline constexpr const char* kSanitizer = "sanitizer build";       // too slow under a sanitizer
inline constexpr const char* kNotBuilt = "not built";              // an optional part of dmx
inline constexpr const char* kOneProcess = "one process only";     // a test that forks a peer
inline constexpr const char* kNotExercised = "case not exercised";  // the machine never made it happen
inline constexpr const char* kNotInstalled = "not installed";      // a third-party package (pytest's too)

// Why CUDA device `device` cannot be used here (dmx::mem_available's reason); empty when it can.
// Initialises CUDA in this process: tests that fork after using CUDA probe in a child instead
// (tests/transport/gpu_children.h).
inline std::string gpu_missing(int device = 0) {
  Status s = mem_available(MemSpec{MemKind::kCuda, device});
  return s.ok() ? std::string() : s.message();
}

}  // namespace dmx::test

// Skips with the cause's wording. Each is a statement; the text after it is streamed into it.
#define DMX_SKIP(cause) GTEST_SKIP() << (cause) << ": "

// Skips unless CUDA device 0 can be used here, saying why not.
#define DMX_SKIP_WITHOUT_GPU()                                                     \
  if (std::string dmx_gpu_missing_ = ::dmx::test::gpu_missing(); !dmx_gpu_missing_.empty()) \
  DMX_SKIP(::dmx::test::kNoGpu) << dmx_gpu_missing_
