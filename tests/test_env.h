// What the machine running the tests lacks, and how long a busy one may take.
//
// Skips: one wording per cause, "<cause>: <the precise reason>", so that a reader (and the summary
// at the end of scripts/test.sh, which counts skips by the text before the first ':') sees why.
// Use the macros below rather than writing a cause by hand.
//
// Time: tests judge behaviour, not the machine's speed. A busy 2-core machine (load 8-13) stalls
// a process for seconds, so waits for "it happens" use kEventually, and a bound on "it happens
// promptly" is kept well below the timer a bug would wait for and well above what load adds.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
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
inline constexpr const char* kNoRdma = "no RDMA device";           // no verbs device with an active port

// Why CUDA device `device` cannot be used here (dmx::mem_available's reason); empty when it can.
// Initialises CUDA in this process: tests that fork after using CUDA probe in a child instead
// (tests/transport/gpu_children.h).
inline std::string gpu_missing(int device = 0) {
  Status s = mem_available(MemSpec{MemKind::kCuda, device});
  return s.ok() ? std::string() : s.message();
}

// A wait for something that must happen: it bounds the wait (a hang fails the test) and never
// judges speed. Minutes, not seconds: a multi-GiB transfer on a loaded 2-core machine takes them.
inline constexpr std::chrono::seconds kEventually{180};

// peer_timeout for tests that are not about it: longer than any stall load causes, so that a live
// peer is never taken for a dead one. Tests of the timeout itself set their own, and bound the
// detection by that timeout plus kLoadSlack.
inline constexpr const char* kPatientPeerTimeout = "60s";

// What load may add to a bound on "it happens promptly" (scheduling, a stalled peer process).
inline constexpr std::chrono::seconds kLoadSlack{10};

}  // namespace dmx::test

// Skips with the cause's wording. Each is a statement; the text after it is streamed into it.
#define DMX_SKIP(cause) GTEST_SKIP() << (cause) << ": "

// Skips unless CUDA device 0 can be used here, saying why not.
#define DMX_SKIP_WITHOUT_GPU()                                                     \
  if (std::string dmx_gpu_missing_ = ::dmx::test::gpu_missing(); !dmx_gpu_missing_.empty()) \
  DMX_SKIP(::dmx::test::kNoGpu) << dmx_gpu_missing_
