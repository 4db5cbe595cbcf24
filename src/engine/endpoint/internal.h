// What the endpoint's files share and nothing else needs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dmx/endpoint.h"
#include "dmx/memory.h"
#include "dmx/status.h"
#include "wire/frame.h"

namespace dmx {

class CopyCrew;
struct VecLayout;
struct OpState;
}

namespace dmx::endpoint {

// Per-message cost charged against the peer's unexpected budget (so empty messages count too).
inline constexpr uint64_t kEagerOverhead = 64;
// An Inbound whose total is not known yet.
inline constexpr uint64_t kUnknownTotal = UINT64_MAX;
// Chunks one payload path may have in flight from this side.
inline constexpr size_t kPathWindow = 8;
// On a path whose receiver copies out of the sender's memory (cuda_ipc) a chunk holds nothing on
// the sender but its table entry, and eight small ones in flight leave the path idle between
// round trips (a vectored write of 16 KiB or 64 KiB blocks moved at ~114,000 chunks/s either way):
// chunks up to kSmallPathChunk may fill up to kSmallPathWindow, within max_inflight_ops. Such a
// path's receiver takes max(max_inflight_ops, kSmallPathWindow) chunks in flight.
inline constexpr uint64_t kSmallPathChunk = 1 << 20;
inline constexpr size_t kSmallPathWindow = 256;
// Table chunks (endpoint/tables.cc) take the wire's largest lists: segments up to
// wire::kMaxTablePiece, lists of up to wire::kMaxTableBytes (and the path's max_chunk). On 1xH200,
// lists of 128 pieces and 8 MiB moved 16 KiB blocks at 82 GB/s and 64 KiB ones at 236; of 1,024
// and 32 MiB at 105 and 378 (docs/performance.md).
// Lists one path may have in flight when its receiver copies out of the sender's memory (cuda_ipc;
// the sender holds nothing but their table entries): at most 2 GiB, so that the PATH_DONEs' round
// trip (~200 us on 1xH200 while the receiver's stream is busy reading lists) does not stall it.
inline constexpr size_t kListWindow = 64;
// RxPlan::host_tag: what a landed frame's bytes were for.
// kTagBounced: counted, its bytes in a bounce buffer (ctx) to scatter over a vectored recv's pieces.
// kTagEagerHeld: an eager message read whole into a buffer of its own (ctx) before it is matched.
enum HostTag : int { kTagNone = 0, kTagEagerMatched, kTagEagerUnexpected, kTagCounted, kTagBounced, kTagEagerHeld };

inline Status protocol(std::string text) { return Status(Code::kProtocol, std::move(text)); }

// A buffer an operation may use: not null when it has bytes, and memory this process can reach.
inline Status region_problem(const MemRegion& r, std::string_view what) {
  if (r.size > 0 && r.ptr == nullptr) return Status(Code::kInvalidArgument, std::string(what) + ": null buffer");
  return mem_available(r.where);
}

// A peer's vectored read segments are charged to the peer_memory_budget this many at a time.
inline constexpr size_t kVecChargeSegs = 4096;

// A vectored write's chunks name their regions, not their place in the operation: its CRC is not
// folded (Request::crc32c() is 0; each chunk is still checked where it lands).
bool vec_write(const OpState& op);

// A vectored list checked and laid out (endpoint/vec.cc): `layout`, or `status` with the index of
// the first bad entry in `bad`.
struct VecBuild {
  Status status;
  int64_t bad = -1;
  std::shared_ptr<VecLayout> layout;
};
// write: no two entries' remote ranges overlap; read: no two local ranges. A long list is done in
// parts by `crew` (null: by the caller alone; the context's list_threads); the result is the same.
VecBuild build_one_sided(std::span<const MemRegion> local, std::span<const RemoteRegion> remote,
                         std::span<const IoEntry> entries, bool write, CopyCrew* crew);
// recv: no two pieces overlap.
VecBuild build_pieces(std::span<const MemRegion> regions, std::span<const IoPiece> pieces, bool recv);
// A list of at least this many entries is checked and laid out by the crew (vec_list.cc), and a
// read's READ_REQ tables are filled by it.
inline constexpr size_t kCrewEntries = 16384;

// A vectored read's READ_REQ frames, but for type, id and accepts (set under the endpoint's
// lock): the segments in order, in tables of up to kMaxTableEntries (a segment of 4 GiB or more,
// whose length an entry cannot hold, in a READ_REQ of its own); every frame but the last says
// more follow. A long list's tables are filled by `crew`, each on its own (null: by the caller).
using ControlFrame = std::pair<wire::FrameHeader, std::vector<unsigned char>>;
std::vector<ControlFrame> read_req_frames(const VecLayout& l, CopyCrew* crew);

}  // namespace dmx::endpoint
