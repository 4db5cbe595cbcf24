// Helpers for GPU tests that run their CUDA work in forked children (CUDA cannot be used in a
// child forked after the parent initialised it): a child-side check, and the GPU probe.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <string>

#include "memory/backend.h"
#include "transport/cuda_ipc/cuda_ipc.h"
#include "transport/transport_test_util.h"
#include "test_env.h"

// In a child: returns `code` (its exit status) with a message when `cond` is false.
#define CHILD_CHECK(cond, code)                                                               \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "child %d: check failed: %s (line %d)\n", ::getpid(), #cond, __LINE__); \
      return code;                                                                            \
    }                                                                                         \
  } while (0)

namespace dmx::testing {

// Number of GPUs usable for cuda_ipc, probed in a child; 0 and the reason when none.
inline int probe_gpus(std::string* reason) {
  std::string text = text_from_child([] {
    Status gpu = mem_available(MemSpec{MemKind::kCuda, 0});  // the reason DMX_SKIP_WITHOUT_GPU gives
    if (!gpu.ok()) return "0" + gpu.message();
    Status s = cuda_ipc::available();
    auto n = cuda_device_count();
    return s.ok() ? (n.ok() ? std::to_string(*n) : "0" + n.status().message()) : "0" + s.message();
  });
  if (text.empty()) {
    *reason = "GPU probe child failed";
    return 0;
  }
  if (text[0] == '0') {
    *reason = text.size() > 1 ? text.substr(1) : "no CUDA device";
    return 0;
  }
  return std::stoi(text);
}

}  // namespace dmx::testing
