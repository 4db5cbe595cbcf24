// Endpoint: table chunks (docs/wire.md "Tables"). A vectored write's (or a vectored read's reply's)
// run of small segments goes to a path that takes lists (PayloadPath::max_list) as one chunk: the
// header, a table of the pieces' destinations (key, offset, length each; a read's: key 0 and the
// offset in the read) and the path's list descriptor. One chunk, one completion and one PATH_DONE
// for up to kMaxTableEntries pieces, where a chunk each cost a KV-cache write of 16 KiB blocks
// ~3.7 us per block (docs/performance.md).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/checked.h"
#include "core/trace.h"
#include "engine/endpoint/endpoint_impl.h"
#include "engine/endpoint/internal.h"

namespace dmx {

using wire::FrameHeader;
using wire::FrameType;
using namespace endpoint;

static_assert(wire::kMaxTableDescriptor == kMaxListDescriptor);

size_t EndpointImpl::list_pieces(const PathState& ps, const Transfer& t) const {
  const OpState& op = *t.op;
  // Checksummed endpoints send segments one by one: a chunk's CRC covers one run of bytes.
  if (!op.vec || (t.type != FrameType::kWriteData && t.type != FrameType::kReadData) || session_.checksum) return 0;
  size_t max = std::min<size_t>(ps.path->max_list(), wire::kMaxTableEntries);
  const auto& segs = op.vec->segs;
  if (max < 2 || t.seg >= segs.size() || segs[t.seg].at != t.next) return 0;  // mid-segment: chunk by chunk
  uint64_t cap = std::min(ps.path->max_chunk(), wire::kMaxTableBytes), bytes = 0;
  size_t n = 0;
  for (size_t k = t.seg; k < segs.size() && n < max; ++k, ++n) {
    uint64_t len = segs[k].length;
    if (len > wire::kMaxTablePiece || len > cap - bytes) break;
    bytes += len;
  }
  return n;
}

// Inline, a table's entries and bytes travel in one frame of at most `chunk` bytes: worth it from
// two pieces (65,536 blocks of 16 KiB host to host at 8 streams: 0.45 of one contiguous write as a
// frame each, 0.85 as tables; docs/performance.md).
size_t EndpointImpl::inline_table_pieces(const Transfer& t, uint64_t chunk) const {
  const OpState& op = *t.op;
  if (!op.vec || (t.type != FrameType::kWriteData && t.type != FrameType::kReadData) || session_.checksum) return 0;
  const auto& segs = op.vec->segs;
  if (t.seg >= segs.size() || segs[t.seg].at != t.next) return 0;  // mid-segment: chunk by chunk
  uint64_t bytes = 0;
  size_t n = 0;
  for (size_t k = t.seg; k < segs.size() && n < wire::kMaxTableEntries; ++k, ++n) {
    uint64_t cost = segs[k].length + wire::kTableEntrySize;
    if (segs[k].length > wire::kMaxTablePiece || cost > chunk - bytes) break;
    bytes += cost;
  }
  return n;
}

void EndpointImpl::post_inline_table(Transfer& t, size_t n, stream::TxItem* out) {
  OpState& op = *t.op;
  const auto& segs = op.vec->segs;
  out->owned.resize(n * wire::kTableEntrySize);
  out->pieces.reserve(n);
  uint64_t len = 0;
  unsigned char* p = out->owned.data();
  const bool read = t.type == FrameType::kReadData;  // a piece's place: the offset in the read
  for (size_t k = t.seg; k < t.seg + n; ++k, p += wire::kTableEntrySize) {
    wire::put_table_entry(p, {read ? 0 : segs[k].rkey, read ? segs[k].at : segs[k].roffset,
                              static_cast<uint32_t>(segs[k].length)});  // <= kMaxTablePiece
    out->pieces.push_back(stream::Piece{segs[k].local, segs[k].length, {}});
    len += segs[k].length;
  }
  FrameHeader& h = out->header;
  h.type = t.type;
  h.id = op.id;
  if (read) {  // a0 and a1 as any READ_DATA chunk's: the first piece's offset, the read's length
    h.flags = wire::kFlagTable;
    h.a0 = t.next;
    h.a1 = op.total;
    h.a2 = n;
  } else {
    h.flags = wire::kFlagVector | wire::kFlagTable | (op.notify ? wire::kFlagNotify : 0);
    h.a0 = n;
    h.a1 = 0;
    h.a2 = op.total;
    h.a3 = op.notify_value;
  }
  out->src = out->owned.data();
  out->where = t.where;
  out->len = out->owned.size() + len;
  out->ctx = t.op;
  t.next += len;
  t.emitted = true;
  op.handed += len;
  ++op.inflight;
  DMX_TRACE_POINT("tbl.inline");
}

Status EndpointImpl::post_path_list(PathState& ps, Transfer& t, size_t n, stream::TxItem* out) {
  OpState& op = *t.op;
  const auto& segs = op.vec->segs;
  list_srcs_.clear();
  list_srcs_.reserve(n);
  for (size_t k = t.seg; k < t.seg + n; ++k) list_srcs_.push_back(MemRegion{segs[k].local, segs[k].length, t.where});
  uint64_t seq = ps.tx_seq;
  size_t taken = 0;
  DMX_ASSIGN_OR_RETURN(std::vector<unsigned char> desc, ps.path->post_tx_list(seq, list_srcs_, &taken));
  if (taken == 0 || taken > n || desc.empty() || desc.size() > kMaxListDescriptor)
    return Status(Code::kInternal, fmt::format("{} path took {} of {} pieces with a {}-byte descriptor",
                                               ps.path->name(), taken, n, desc.size()));
  std::vector<unsigned char> payload(taken * wire::kTableEntrySize + desc.size());
  uint64_t len = 0;
  unsigned char* p = payload.data();
  const bool read = t.type == FrameType::kReadData;  // a piece's place: the offset in the read
  for (size_t k = t.seg; k < t.seg + taken; ++k, p += wire::kTableEntrySize) {
    wire::put_table_entry(p, {read ? 0 : segs[k].rkey, read ? segs[k].at : segs[k].roffset,
                              static_cast<uint32_t>(segs[k].length)});  // <= kMaxTablePiece
    len += segs[k].length;
  }
  std::memcpy(p, desc.data(), desc.size());
  FrameHeader& h = out->header;
  h.flags |= wire::kFlagTable;
  if (read) {  // a0 (this chunk's offset) and a1 (the read's length) as next_chunk set them
    h.a2 = taken;
  } else {
    h.a0 = taken;
    h.a1 = 0;
  }
  h.path = ps.id;
  h.payload_len = static_cast<uint32_t>(payload.size());
  ++ps.tx_seq;
  ps.tx[seq] = PathState::Tx{t.op, len};
  out->owned = std::move(payload);
  out->src = out->owned.data();
  out->where = MemSpec{};
  out->len = out->owned.size();
  out->ctx = nullptr;  // done when the path says so
  t.next += len;
  t.emitted = true;
  op.handed += len;
  op.via |= path_bit(ps.id);
  ++op.inflight;
  DMX_TRACE_POINT("tbl.tx");
  return Status();
}

// Every entry is the peer's word, checked as a vectored write's chunk is (plan_vec_write): a key
// registered here, the piece inside its region, the pieces' sum within what the write announced.
Status EndpointImpl::on_table_header(PathState& ps, const FrameHeader& h, const std::vector<unsigned char>& payload) {
  DMX_TRACE_POINT("tbl.rx");
  if (h.type == FrameType::kReadData) return on_read_table(ps, h, payload);
  if (h.type != FrameType::kWriteData) return protocol(fmt::format("{} carries a table", wire::describe(h)));
  size_t n = h.a0;  // 1..kMaxTableEntries, room for the table (frame.cc)
  if (n > ps.path->max_list())
    return protocol(fmt::format("{}: {} pieces by {}, which takes {} at most", wire::describe(h), n, ps.path->name(),
                                ps.path->max_list()));
  // The write's first chunk (or one after an early CANCEL) opens it; a later one keeps its form.
  DMX_ASSIGN_OR_RETURN(InWrite * opened, open_vec_write(h));
  DMX_ASSIGN_OR_RETURN(uint64_t len, write_table_dsts(*opened, h, payload.data(), n));
  return post_table(ps, h, payload, len, 0);
}

// A write table's n entries at `p`, checked; their destinations in list_dsts_ (all null when the
// write is refused, cancelled or withdrawn: dropped). Returns the pieces' sum, reserved in `w`.
Result<uint64_t> EndpointImpl::write_table_dsts(InWrite& w, const FrameHeader& h, const unsigned char* p, size_t n) {
  bool drop = w.refused || w.cancelled || w.withdrawn;
  list_dsts_.clear();
  list_dsts_.reserve(n);
  uint64_t len = 0, last_key = 0;
  Registered* reg = nullptr;
  for (size_t k = 0; k < n; ++k, p += wire::kTableEntrySize) {
    auto [key, offset, piece] = wire::get_table_entry(p);
    if (piece == 0 || piece > w.expected - w.reserved - len)
      return protocol(fmt::format("write op {}: table piece {} of {} bytes (the write has {} bytes left)", h.id, k,
                                  piece, w.expected - w.reserved - len));
    if (piece > wire::kMaxTablePiece || piece > wire::kMaxTableBytes - len)
      return protocol(fmt::format("write op {}: table piece {} of {} bytes makes {} in the table (at most {} a "
                                  "piece, {} a table)",
                                  h.id, k, piece, len + piece, wire::kMaxTablePiece, wire::kMaxTableBytes));
    len += piece;
    if (drop) {
      list_dsts_.push_back(MemRegion{nullptr, piece, {}});
      continue;
    }
    if (reg == nullptr || key != last_key) {
      auto r = w.regs.find(key);
      if (r != w.regs.end()) {
        reg = r->second.get();
      } else if (auto got = ctx_->acquire_registration(key, weak_from_this())) {
        if (w.regs.size() >= static_cast<size_t>(params_.max_inflight_ops)) {
          ContextImpl::release_registration(*got);
          return protocol(fmt::format("write op {} names more than {} regions", h.id, params_.max_inflight_ops));
        }
        reg = got.get();
        w.regs.emplace(key, std::move(got));
      } else {
        Status refused(Code::kNotFound, fmt::format("write refused: unknown remote key 0x{:x}", key));
        DMX_RETURN_IF_ERROR(note_refusal(refused));
        send_ack(h.id, wire::OpKind::kWrite, refused);
        w.refused = drop = true;
        for (MemRegion& d : list_dsts_) d.ptr = nullptr;
        list_dsts_.push_back(MemRegion{nullptr, piece, {}});
        continue;
      }
      last_key = key;
    }
    const MemRegion& r = reg->region;
    if (!range_fits(offset, piece, r.size))
      return protocol(fmt::format("vectored write op {}: table piece {} of {} bytes at offset {} lies outside the "
                                  "{}-byte region of key 0x{:x}",
                                  h.id, k, piece, offset, r.size, key));
    list_dsts_.push_back(r.sub(offset, piece));
  }
  w.reserved += len;
  return len;
}

// An inline table (path 0) has landed: its pieces' bytes follow it in the frame. Checked as a
// path's table is; the bytes scatter straight into host memory, or through one staging slot into
// device memory; all dropped when the write (or read) is.
Result<stream::RxPlan> EndpointImpl::on_prefix(int stream, const FrameHeader& h,
                                               const std::vector<unsigned char>& table) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t n = wire::table_pieces(h);  // on_header let through only an inline table
  uint64_t len = 0;
  stream::RxPlan plan;
  plan.kind = stream::RxPlan::Kind::kDiscard;
  if (h.type == FrameType::kReadData) {
    bool counted = false;
    DMX_ASSIGN_OR_RETURN(len, read_table_dsts(h, table.data(), n, &counted));
    plan.host_tag = counted ? kTagCounted : 0;
  } else {
    DMX_ASSIGN_OR_RETURN(InWrite * w, open_vec_write(h));
    DMX_ASSIGN_OR_RETURN(len, write_table_dsts(*w, h, table.data(), n));
  }
  // Checked after the bytes were reserved: a protocol error fails the endpoint whatever was.
  if (len != h.payload_len - table.size())
    return protocol(fmt::format("{} op {}: an inline table's pieces sum to {} bytes; {} follow it",
                                h.type == FrameType::kReadData ? "read" : "write", h.id, len,
                                h.payload_len - table.size()));
  // Several links: counted from here, where its bytes are reserved (a stream lost before it lands
  // gives them back, endpoint/links.cc).
  if (session_.multilink && stream != 0) link_planned(stream, h, plan);
  if (list_dsts_.empty() || list_dsts_[0].ptr == nullptr) return plan;
  plan.kind = stream::RxPlan::Kind::kHost;
  plan.pieces.reserve(n);
  for (const MemRegion& d : list_dsts_) {
    if (d.where.is_device() && plan.kind == stream::RxPlan::Kind::kHost) {
      plan.kind = stream::RxPlan::Kind::kDevice;
      plan.where = d.where;
    }
    plan.pieces.push_back(stream::Piece{d.ptr, d.size, d.where});
  }
  return plan;
}

// A vectored read's reply by a path: its entries, checked (read_table_dsts), then the path's list.
Status EndpointImpl::on_read_table(PathState& ps, const FrameHeader& h, const std::vector<unsigned char>& payload) {
  size_t n = wire::table_pieces(h);  // 1..kMaxTableEntries, room for the table (frame.cc)
  if (n > ps.path->max_list())
    return protocol(fmt::format("{}: {} pieces by {}, which takes {} at most", wire::describe(h), n, ps.path->name(),
                                ps.path->max_list()));
  bool counted = false;
  DMX_ASSIGN_OR_RETURN(uint64_t len, read_table_dsts(h, payload.data(), n, &counted));
  return post_table(ps, h, payload, len, counted ? kTagCounted : 0);
}

// A read table's n entries at `p`: each names where its piece goes in the read (key 0), checked as
// a READ_DATA chunk is (plan_inbound): inside the read, inside one of its segments (the reader
// cut them; the target serves them as cut), within what the target has left to send. Their
// destinations in list_dsts_ (all null when the read is no longer wanted: dropped, and
// `*counted` false). Returns the pieces' sum, reserved in the read.
Result<uint64_t> EndpointImpl::read_table_dsts(const FrameHeader& h, const unsigned char* p, size_t n, bool* counted) {
  auto it = reads_.find(h.id);
  if (it == reads_.end()) return protocol(fmt::format("{} for unknown id {}", wire::describe(h), h.id));
  Inbound& in = it->second;
  if (h.a1 != in.total)
    return protocol(fmt::format("{} announces a {}-byte read; {} bytes were asked", wire::describe(h), h.a1, in.total));
  OpState* op = in.op.get();
  const bool drop = op == nullptr || (op->phase != OpPhase::kActive && op->phase != OpPhase::kPosted);
  if (!drop && !op->vec) return protocol(fmt::format("{}: a table for a read that is not vectored", wire::describe(h)));
  list_dsts_.clear();
  list_dsts_.reserve(n);
  uint64_t len = 0;
  size_t seg = 0;  // a table's pieces come in the read's order: each found next to the last
  for (size_t k = 0; k < n; ++k, p += wire::kTableEntrySize) {
    auto [key, offset, piece] = wire::get_table_entry(p);
    if (key != 0) return protocol(fmt::format("read {}: table piece {} names key 0x{:x}", h.id, k, key));
    if (piece == 0 || piece > in.expected - in.reserved - len || piece > wire::kMaxTablePiece ||
        piece > wire::kMaxTableBytes - len)
      return protocol(fmt::format("read {}: table piece {} of {} bytes (the read has {} bytes left; at most {} a "
                                  "piece, {} a table)",
                                  h.id, k, piece, in.expected - in.reserved - len, wire::kMaxTablePiece,
                                  wire::kMaxTableBytes));
    if (!range_fits(offset, piece, in.total))
      return protocol(fmt::format("read {}: table piece {} [{}, +{}) lies outside the {}-byte read", h.id, k, offset,
                                  piece, in.total));
    len += piece;
    MemRegion dst{nullptr, piece, {}};
    if (!drop) {
      dst = op->vec->slice(offset, piece, &seg);
      if (dst.ptr == nullptr)
        return protocol(fmt::format("read {}: table piece {} [{}, +{}) spans segments of the vectored read", h.id, k,
                                    offset, piece));
    }
    list_dsts_.push_back(dst);
  }
  in.reserved += len;
  if (!drop) {
    op->phase = OpPhase::kActive;
    ++op->inflight;
  }
  *counted = !drop;
  return len;
}

Status EndpointImpl::post_table(PathState& ps, const FrameHeader& h, const std::vector<unsigned char>& payload,
                                uint64_t len, int host_tag) {
  const size_t n = wire::table_pieces(h);
  uint64_t seq = ps.rx_seq++;
  ps.rx[seq] = PathState::Rx{h, len, host_tag, nullptr, MemRegion{nullptr, len, {}}};
  std::span<const unsigned char> desc(payload.data() + n * wire::kTableEntrySize,
                                      payload.size() - n * wire::kTableEntrySize);
  if (Status refused = ps.path->post_rx_list(seq, desc, list_dsts_); !refused.ok()) {
    ps.rx.erase(seq);
    if (refused.code() == Code::kProtocol)
      return protocol(fmt::format("{}: {}", wire::describe(h), refused.message()));
    const Status s = chunk_failure(refused);
    // Arrived but failed, as a failed copy.
    if (h.type == FrameType::kWriteData) {
      land_write(h, len, s);
    } else {
      DMX_RETURN_IF_ERROR(land_inbound(reads_, h, len, host_tag != 0, s));
    }
    // The path never took the list: the sender's pieces are free again, and its window slot.
    if (ps.path->receiver_releases()) send_path_done(ps.id, seq);
  }
  DMX_TRACE_POINT("tbl.posted");
  return Status();
}

}  // namespace dmx
