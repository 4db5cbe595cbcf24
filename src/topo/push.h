// GPU push advisor: whether a small device copy should be made by the GPU's SMs (one small kernel:
// loads and stores) rather than by a copy engine, and up to which size, with the reason
// (docs/gpu-push.md).
//
// The rule. A copy-engine copy has a fixed cost of 5.7–7.4 µs p50 for 8 bytes on the GPU machines
// (docs/performance.md, "Small copies"); a kernel launch costs less, and its stores are posted
// writes (seed 002: a write is one TLP, a read is a request plus completions split at the read
// completion boundary, and waits a round trip). So: push below a size when the SMs *write* across
// the link (a peer GPU over NVLink, pinned host memory over PCIe); push only much smaller copies
// when they must *read* across PCIe (pinned host memory into the GPU); never read across sockets
// (a SYS path: every completion crosses the inter-socket link). Above the size the copy engine's
// bandwidth wins. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "dmx/status.h"

namespace dmx::topo {

// The largest copy an SM push takes at all (memory/cuda/push.h's kPushCopyMax).
inline constexpr uint64_t kPushLimit = uint64_t{1} << 20;

enum class PushMode : uint8_t { kAuto, kOn, kOff };
// "auto", "on", "off" (the gpu_push setting); kInvalidArgument otherwise.
Result<PushMode> parse_push_mode(std::string_view text);
std::string_view push_mode_name(PushMode mode);

enum class PushLink : uint8_t {
  kPeerGpu,    // the SMs store into another GPU's memory (NVLink or PCIe peer-to-peer): cuda_ipc
  kHostWrite,  // the SMs store into pinned host memory over PCIe: a staged send
  kHostRead,   // the SMs load pinned host memory over PCIe into their own: a staged receive
};
std::string_view push_link_name(PushLink link);

struct PushFacts {
  PushLink link = PushLink::kPeerGpu;
  uint32_t mps = 256;      // PCIe max payload size on the GPU's path (256 when unknown)
  uint32_t rcb = 64;       // read completion size the GPU's reads of host memory see
  std::string path_class;  // GPU to the staging memory's host bridge: "PIX", "PXB", "PHB", "SYS"; "" unknown
};

// Facts with only the link known (the rest as when unknown).
inline PushFacts push_facts(PushLink link, std::string path_class = "") {
  PushFacts f;
  f.link = link;
  f.path_class = std::move(path_class);
  return f;
}

struct PushPlan {
  uint64_t max = 0;  // copies of 1..max bytes are pushed; 0: none
  std::string why;   // one line, for the path's reason string and `dmx topo`
  bool push(uint64_t bytes) const { return bytes > 0 && bytes <= max; }
};

// `configured_max` is the gpu_push_max setting (clamped to kPushLimit).
PushPlan plan_gpu_push(PushMode mode, uint64_t configured_max, const PushFacts& facts);

struct Topology;
// `dmx topo`'s section: per GPU, the staged send and receive plans with its path's MPS and root
// port RCB (staging memory is placed on the GPU's own node, so the path is PHB); then GPU to GPU
// (cuda_ipc).
std::string render_push_text(const Topology& topo, PushMode mode, uint64_t configured_max);

}  // namespace dmx::topo
