// Endpoint: end-to-end CRC32C of every data chunk (setting checksum=crc32c, docs/checksum.md).
// Streams stamp and check inline chunks (stream/stream.cc, stream_rx.cc: the device computes the
// CRC of device memory beside the staging copy); here the endpoint checks the flag, judges what
// landed, stamps and checks chunks that payload paths move, and folds each operation's chunks into
// its CRC.
#include <fmt/format.h>

#include "core/crc32c.h"
#include "core/log.h"
#include "engine/endpoint/endpoint_impl.h"
#include "engine/endpoint/internal.h"

namespace dmx {

using wire::FrameHeader;
using wire::FrameType;
using namespace endpoint;

namespace {
// A device checksum is a few microseconds of kernel; this only bounds a wedged device.
constexpr auto kChecksumDeadline = std::chrono::seconds(30);
}  // namespace

Status EndpointImpl::check_flag(const FrameHeader& h) const {
  bool flagged = (h.flags & wire::kFlagChecksum) != 0;
  if (flagged == session_.checksum) return Status();
  return protocol(fmt::format("{} {} a checksum, but the handshake agreed {}", wire::describe(h),
                              flagged ? "carries" : "lacks", session_.checksum ? "crc32c" : "none"));
}

Status EndpointImpl::verify(const FrameHeader& h, uint32_t landed) {
  if (landed == h.crc) return Status();
  ++counters_.checksum_errors;
  Status s(Code::kDataLoss, fmt::format("{}: the landed bytes have CRC32C {:08x}, the sender's was {:08x}",
                                        wire::describe(h), landed, h.crc));
  DMX_LOG_LIMITED(peer_log_, err, "checksum", "endpoint to {}: {}", session_.peer, s.message());
  return s;
}

Status EndpointImpl::verify_path_chunk(const FrameHeader& h, const MemRegion& dst) {
  auto landed = checksum_memory(dst.where, dst.ptr, dst.size, Deadline::after(kChecksumDeadline));
  std::lock_guard<std::mutex> lock(mu_);
  if (!landed.ok()) return landed.status();
  return verify(h, *landed);
}

void EndpointImpl::fold_chunk(OpState& op, uint64_t offset, uint64_t len, uint32_t crc) {
  if (offset > op.total || len > op.total - offset) return;  // checked on arrival; never folds outside
  op.crc_raw = crc32c::fold(op.crc_raw, op.total, offset, len, crc);
}

uint64_t EndpointImpl::chunk_offset(const OpState& op, const FrameHeader& h) {
  switch (h.type) {
    case FrameType::kWriteData: return h.a1 - op.roffset;
    case FrameType::kEager: return 0;
    default: return h.a0;  // kSendData, kReadData
  }
}

Status EndpointImpl::stamp_path_chunk(const MemRegion& src, FrameHeader* h) {
  if (!session_.checksum) return Status();
  DMX_ASSIGN_OR_RETURN(uint32_t crc, checksum_memory(src.where, src.ptr, src.size, Deadline::after(kChecksumDeadline)));
  h->flags |= wire::kFlagChecksum;
  h->crc = crc;
  return Status();
}

}  // namespace dmx
