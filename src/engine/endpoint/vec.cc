// Endpoint: vectored operations' lists. A list is checked whole before anything is posted (every
// index, offset and length against its region, overflow-safe; destinations must not overlap) and
// turned into a VecLayout: the operation's bytes as segments, adjacent entries merged.
#include <fmt/format.h>

#include <algorithm>
#include <bit>

#include <cstring>
#include <unordered_map>

#include "core/checked.h"
#include "engine/endpoint/endpoint_impl.h"
#include "engine/endpoint/internal.h"
#include "engine/op.h"

namespace dmx {

size_t VecLayout::find(uint64_t at, size_t hint) const {
  for (size_t k = hint; k < segs.size() && k <= hint + 1 && segs[k].at <= at; ++k)
    if (k + 1 == segs.size() || at < segs[k + 1].at) return k;
  auto it = std::upper_bound(segs.begin(), segs.end(), at, [](uint64_t a, const VecSeg& s) { return a < s.at; });
  return static_cast<size_t>(it - segs.begin()) - 1;  // segs[0].at == 0 <= at
}

MemRegion VecLayout::slice(uint64_t at, uint64_t len, size_t* hint) const {
  if (segs.empty() || at >= total) return MemRegion{nullptr, 0, where};
  size_t k = find(at, hint != nullptr ? *hint : 0);
  if (hint != nullptr) *hint = k;
  const VecSeg& s = segs[k];
  uint64_t in = at - s.at;
  if (!range_fits(in, len, s.length)) return MemRegion{nullptr, 0, where};
  return MemRegion{s.local + in, len, where};
}

namespace endpoint {
namespace {

struct Span {  // a destination range, for the overlap check
  uint64_t space, begin, end;
  uint32_t index;
};

// Scratch kept per thread for lists up to a million entries; a larger one's is given back.
void release_scratch(std::vector<Span>& spans) {
  if (spans.capacity() > (size_t{1} << 20)) std::vector<Span>().swap(spans);
}

// Sorts by (space, begin): spaces become small ordinals, then a stable LSD radix sort on begin
// (11-bit digits, passes where every item has the same digit skipped) and one counting pass on
// the ordinal. 100,000 spans: about a millisecond, where std::sort took several.
void sort_spans(std::vector<Span>& spans) {
  if (spans.size() < 4096) {  // the radix passes' tables cost more than they save
    std::sort(spans.begin(), spans.end(),
              [](const Span& a, const Span& b) { return a.space != b.space ? a.space < b.space : a.begin < b.begin; });
    return;
  }
  // A list's entries mostly name one region after another: the last space found is asked first,
  // and the map (whose emplace allocates a node even for a key it has) only when it changes.
  std::unordered_map<uint64_t, uint64_t> ordinal;
  uint64_t last = 0, last_ordinal = 0;
  for (size_t k = 0; k < spans.size(); ++k) {
    Span& s = spans[k];
    if (k == 0 || s.space != last) {
      last = s.space;
      auto [it, fresh] = ordinal.try_emplace(s.space, ordinal.size());
      last_ordinal = it->second;
    }
    s.space = last_ordinal;
  }
  thread_local std::vector<Span> tmp;  // kept: a fresh 3 MB array costs its page faults each call
  tmp.resize(spans.size());
  uint64_t differ = 0;
  for (const Span& s : spans) differ |= s.begin ^ spans[0].begin;
  auto pass = [&](auto digit, size_t buckets) {
    std::vector<size_t> count(buckets + 1, 0);
    for (const Span& s : spans) ++count[digit(s) + 1];
    for (size_t b = 1; b <= buckets; ++b) count[b] += count[b - 1];
    for (const Span& s : spans) tmp[count[digit(s)]++] = s;
    spans.swap(tmp);
  };
  // 11-bit digits: the counts (16 KiB) stay in the cache, where 16-bit ones (512 KiB a pass) cost
  // as much as the items.
  constexpr int kBits = 11;
  constexpr uint64_t kMask = (uint64_t{1} << kBits) - 1;
  for (int shift = 0; shift < 64; shift += kBits)
    if ((differ >> shift) & kMask) pass([shift](const Span& s) { return (s.begin >> shift) & kMask; }, kMask + 1);
  if (ordinal.size() > 1) pass([](const Span& s) { return s.space; }, ordinal.size());
  release_scratch(tmp);
}

// The shape of a list's destinations, gathered while the list is checked. The KV-cache list has
// every range in one space and of one length L.
struct Shape {
  bool uniform = true;
  size_t count = 0;
  uint64_t space = 0, len = 0, lo = UINT64_MAX, hi = 0;

  void add(uint64_t sp, uint64_t begin, uint64_t length) {
    if (count++ == 0) {
      space = sp;
      len = length;
    } else if (sp != space || length != len) {
      uniform = false;
    }
    lo = std::min(lo, begin);
    hi = std::max(hi, begin);
  }
};

// A KV-cache list whose ranges also start at multiples of L from the lowest (a write's offsets in
// a region, a read's addresses in a paged cache): two overlap exactly when they start at one block,
// which a bitmap of the blocks finds without sorting (65,536 ranges: ~0.1 ms, where the sort took
// ~2) and without copying the ranges out. False when the list is not of that shape, or has such a
// pair (the caller then sorts, to name it). `dest(i, &span)` gives entry i's range, false for none.
template <typename Dest>
bool distinct_blocks(const Shape& shape, size_t n, const Dest& dest) {
  if (shape.count < 4096 || !shape.uniform || shape.len == 0) return false;  // the sort is cheap enough
  const uint64_t len = shape.len, top = (shape.hi - shape.lo) / len;
  if (top / 64 > shape.count) return false;  // a sparse bitmap: at most a word per range
  const bool pow2 = std::has_single_bit(len);
  const int shift = std::countr_zero(len);
  thread_local std::vector<uint64_t> seen;
  seen.assign(top / 64 + 1, 0);
  bool distinct = true;
  for (size_t i = 0; i < n && distinct; ++i) {
    Span d;
    if (!dest(i, &d)) continue;
    uint64_t off = d.begin - shape.lo, b = pow2 ? off >> shift : off / len, bit = uint64_t{1} << (b % 64);
    if (b * len != off || (seen[b / 64] & bit)) distinct = false;  // between two blocks, or named twice
    seen[b / 64] |= bit;
  }
  if (seen.capacity() > (size_t{1} << 20)) std::vector<uint64_t>().swap(seen);
  return distinct;
}

// The entry of the first overlapping pair found (the later index of the pair), or -1. Sorted by
// (space, begin): a range overlaps an earlier one exactly when it begins before the furthest end
// seen so far in its space.
template <typename Dest>
int64_t find_overlap(const Shape& shape, size_t n, const Dest& dest, uint32_t* other) {
  if (distinct_blocks(shape, n, dest)) return -1;
  thread_local std::vector<Span> spans;  // kept between calls (page faults)
  spans.clear();
  spans.reserve(shape.count);
  for (size_t i = 0; i < n; ++i)
    if (Span d; dest(i, &d)) spans.push_back(d);
  bool sorted = true;
  for (size_t k = 1; k < spans.size() && sorted; ++k)
    sorted = spans[k - 1].space < spans[k].space ||
             (spans[k - 1].space == spans[k].space && spans[k - 1].begin <= spans[k].begin);
  if (!sorted) sort_spans(spans);
  int64_t worst = -1;
  for (size_t k = 1, far = 0; k < spans.size(); ++k) {
    if (spans[k].space != spans[far].space) {
      far = k;
      continue;
    }
    if (spans[k].begin < spans[far].end) {
      uint32_t a = spans[k].index, b = spans[far].index;
      int64_t later = std::max(a, b);
      if (worst < 0 || later < worst) {
        worst = later;
        *other = std::min(a, b);
      }
    }
    if (spans[k].end > spans[far].end) far = k;
  }
  release_scratch(spans);
  return worst;
}

VecBuild refuse(int64_t index, Code code, std::string text) {
  VecBuild b;
  b.bad = index;
  b.status = Status(code, fmt::format("entry {}: {}", index, text));
  return b;
}

// Checks local region `k` the first time an entry uses it; every region of a list is of one kind.
Status check_region(std::span<const MemRegion> regions, uint32_t k, std::vector<uint8_t>& seen, MemSpec* where,
                    bool* have_where) {
  if (seen[k]) return Status();
  const MemRegion& r = regions[k];
  if (r.size > 0 && r.ptr == nullptr) return Status(Code::kInvalidArgument, fmt::format("local region {} is null", k));
  if (*have_where && !(r.where == *where))
    return Status(Code::kInvalidArgument, fmt::format("local region {} is {}, an earlier one {}: one memory kind per list",
                                                      k, to_string(r.where), to_string(*where)));
  if (!*have_where) {
    if (Status s = mem_available(r.where); !s.ok())
      return Status(s.code(), fmt::format("local region {}: {}", k, s.message()));
    *where = r.where;
    *have_where = true;
  }
  seen[k] = 1;
  return Status();
}

}  // namespace

VecBuild build_one_sided(std::span<const MemRegion> local, std::span<const RemoteRegion> remote,
                         std::span<const IoEntry> entries, bool write) {
  if (entries.size() > kMaxIoEntries)
    return refuse(static_cast<int64_t>(kMaxIoEntries), Code::kInvalidArgument,
                  fmt::format("a list has at most {} entries (it has {})", kMaxIoEntries, entries.size()));
  auto layout = std::make_shared<VecLayout>();
  std::vector<uint8_t> seen(local.size(), 0);
  bool have_where = false;
  Shape shape;
  layout->segs.reserve(entries.size());
  uint64_t total = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const IoEntry& e = entries[i];
    auto idx = static_cast<int64_t>(i);
    if (e.local >= local.size())
      return refuse(idx, Code::kInvalidArgument,
                    fmt::format("local region {} does not exist (the list names {})", e.local, local.size()));
    if (e.remote >= remote.size())
      return refuse(idx, Code::kInvalidArgument,
                    fmt::format("remote region {} does not exist (the list names {})", e.remote, remote.size()));
    if (Status s = check_region(local, e.local, seen, &layout->where, &have_where); !s.ok())
      return refuse(idx, s.code(), s.message());
    const MemRegion& l = local[e.local];
    const RemoteRegion& r = remote[e.remote];
    if (!range_fits(e.local_offset, e.length, l.size))
      return refuse(idx, Code::kOutOfRange,
                    fmt::format("[{}, +{}) lies outside local region {} of {} bytes", e.local_offset, e.length,
                                e.local, l.size));
    if (!range_fits(e.remote_offset, e.length, r.size))
      return refuse(idx, Code::kOutOfRange,
                    fmt::format("[{}, +{}) lies outside remote region {} of {} bytes", e.remote_offset, e.length,
                                e.remote, r.size));
    if (e.length == 0) continue;
    auto sum = checked_add(total, e.length);
    if (!sum) return refuse(idx, Code::kOutOfRange, "the list's total length exceeds 2^64 bytes");
    char* p = static_cast<char*>(l.ptr) + e.local_offset;
    if (write) shape.add(r.key, e.remote_offset, e.length);
    else shape.add(0, reinterpret_cast<uintptr_t>(p), e.length);
    auto& segs = layout->segs;
    if (!segs.empty() && segs.back().local + segs.back().length == p && segs.back().rkey == r.key &&
        segs.back().roffset + segs.back().length == e.remote_offset) {
      segs.back().length += e.length;
    } else {
      segs.push_back(VecSeg{total, p, e.length, r.key, e.remote_offset});
    }
    total = *sum;
  }
  // Every entry is valid now: the destinations are read back from the list.
  auto dest = [&](size_t i, Span* d) {
    const IoEntry& e = entries[i];
    if (e.length == 0) return false;
    uint64_t begin = write ? e.remote_offset : reinterpret_cast<uintptr_t>(local[e.local].ptr) + e.local_offset;
    *d = Span{write ? remote[e.remote].key : 0, begin, begin + e.length, static_cast<uint32_t>(i)};
    return true;
  };
  uint32_t other = 0;
  if (int64_t bad = find_overlap(shape, entries.size(), dest, &other); bad >= 0)
    return refuse(bad, Code::kInvalidArgument,
                  fmt::format("its {} range overlaps entry {}'s (destinations must not overlap)",
                              write ? "remote" : "local", other));
  layout->total = total;
  if (layout->segs.capacity() > 2 * layout->segs.size() + 64) layout->segs.shrink_to_fit();
  VecBuild b;
  b.layout = std::move(layout);
  return b;
}

VecBuild build_pieces(std::span<const MemRegion> regions, std::span<const IoPiece> pieces, bool recv) {
  if (pieces.size() > kMaxIoEntries)
    return refuse(static_cast<int64_t>(kMaxIoEntries), Code::kInvalidArgument,
                  fmt::format("a list has at most {} pieces (it has {})", kMaxIoEntries, pieces.size()));
  auto layout = std::make_shared<VecLayout>();
  std::vector<uint8_t> seen(regions.size(), 0);
  bool have_where = false;
  Shape shape;
  layout->segs.reserve(pieces.size());
  uint64_t total = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const IoPiece& e = pieces[i];
    auto idx = static_cast<int64_t>(i);
    if (e.reserved != 0) return refuse(idx, Code::kInvalidArgument, "its reserved field is not 0");
    if (e.region >= regions.size())
      return refuse(idx, Code::kInvalidArgument,
                    fmt::format("region {} does not exist (the list names {})", e.region, regions.size()));
    if (Status s = check_region(regions, e.region, seen, &layout->where, &have_where); !s.ok())
      return refuse(idx, s.code(), s.message());
    const MemRegion& l = regions[e.region];
    if (!range_fits(e.offset, e.length, l.size))
      return refuse(idx, Code::kOutOfRange,
                    fmt::format("[{}, +{}) lies outside region {} of {} bytes", e.offset, e.length, e.region, l.size));
    if (e.length == 0) continue;
    auto sum = checked_add(total, e.length);
    if (!sum) return refuse(idx, Code::kOutOfRange, "the list's total length exceeds 2^64 bytes");
    char* p = static_cast<char*>(l.ptr) + e.offset;
    if (recv) shape.add(0, reinterpret_cast<uintptr_t>(p), e.length);  // a send's pieces may overlap
    auto& segs = layout->segs;
    if (!segs.empty() && segs.back().local + segs.back().length == p) segs.back().length += e.length;
    else segs.push_back(VecSeg{total, p, e.length, 0, 0});
    total = *sum;
  }
  auto dest = [&](size_t i, Span* d) {
    const IoPiece& e = pieces[i];
    if (e.length == 0) return false;
    uint64_t begin = reinterpret_cast<uintptr_t>(regions[e.region].ptr) + e.offset;
    *d = Span{0, begin, begin + e.length, static_cast<uint32_t>(i)};
    return true;
  };
  uint32_t other = 0;
  if (int64_t bad = recv ? find_overlap(shape, pieces.size(), dest, &other) : -1; bad >= 0)
    return refuse(bad, Code::kInvalidArgument,
                  fmt::format("it overlaps piece {} (a receive's pieces must not overlap)", other));
  layout->total = total;
  if (layout->segs.capacity() > 2 * layout->segs.size() + 64) layout->segs.shrink_to_fit();
  VecBuild b;
  b.layout = std::move(layout);
  return b;
}

}  // namespace endpoint

using wire::FrameHeader;
using wire::FrameType;
using namespace endpoint;

Request EndpointImpl::refuse_vec(OpType type, const VecBuild& b, const OpOptions& o) {
  auto op = new_op(type, MemRegion{}, o);
  op->failed_entry = b.bad;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Request r = start(op, type == OpType::kRecv ? received_ : initiated_);
    finish(*op, b.status.with_peer(session_.peer));
  }
  deliver();
  return Request(op);
}

Request EndpointImpl::post_write_vec(std::span<const MemRegion> local, std::span<const RemoteRegion> remote,
                                     std::span<const IoEntry> entries, OpOptions o) {
  VecBuild b = build_one_sided(local, remote, entries, /*write=*/true);
  if (!b.status.ok()) return refuse_vec(OpType::kWrite, b, o);
  const VecLayout& l = *b.layout;
  if (l.segs.size() == 1) {  // one contiguous range: a plain write
    const VecSeg& s = l.segs[0];
    return post_one_sided(OpType::kWrite, MemRegion{s.local, s.length, l.where},
                          RemoteRegion{s.rkey, s.roffset + s.length}, s.roffset, std::move(o));
  }
  // Several segments, or none (an empty write: one empty chunk, which carries the notification).
  auto op = new_op(OpType::kWrite, MemRegion{nullptr, l.total, l.where}, o);
  op->vec = std::move(b.layout);
  op->notify = o.notify;
  op->notify_value = o.notify_value;
  std::unique_lock<std::mutex> lock(mu_);
  Request r = start(op, initiated_);
  if (!status_.ok()) {
    finish(*op, status_);
  } else {
    op->id = next_op_++;
    op->phase = OpPhase::kActive;
    ++counters_.writes;
    writes_[op->id] = op;
    tx_.push_back(Transfer{op, FrameType::kWriteData, nullptr, op->region.where});
    tx_.back().accepts = write_accepts();  // as a plain write: paths that land writes take it (devmem)
    has_tx_.store(true, std::memory_order_release);
    wake_for(tx_.back());
  }
  lock.unlock();
  deliver();
  return r;
}

Request EndpointImpl::post_read_vec(std::span<const MemRegion> local, std::span<const RemoteRegion> remote,
                                    std::span<const IoEntry> entries, OpOptions o) {
  VecBuild b = build_one_sided(local, remote, entries, /*write=*/false);
  if (!b.status.ok()) return refuse_vec(OpType::kRead, b, o);
  const VecLayout& l = *b.layout;
  if (l.segs.size() == 1) {
    const VecSeg& s = l.segs[0];
    return post_one_sided(OpType::kRead, MemRegion{s.local, s.length, l.where},
                          RemoteRegion{s.rkey, s.roffset + s.length}, s.roffset, std::move(o));
  }
  // The segments in order, in READ_REQ tables of up to 1,024 (a segment of 4 GiB or more, whose
  // length a table entry cannot hold, in a READ_REQ of its own); the target serves at the last.
  // Built before the lock is taken: the frames need only the operation's id.
  std::vector<std::pair<FrameHeader, std::vector<unsigned char>>> frames;
  std::vector<unsigned char> table;
  auto flush = [&](bool more) {
    if (table.empty()) return;
    FrameHeader t;
    t.flags = wire::kFlagVector | wire::kFlagTable | (more ? wire::kFlagMore : 0);
    t.a0 = table.size() / wire::kTableEntrySize;
    t.payload_len = static_cast<uint32_t>(table.size());
    frames.emplace_back(t, std::move(table));
    table = {};
  };
  for (size_t k = 0; k < l.segs.size(); ++k) {
    const VecSeg& s = l.segs[k];
    const bool last = k + 1 == l.segs.size();
    if (s.length > UINT32_MAX) {
      flush(/*more=*/true);
      FrameHeader one;
      one.flags = wire::kFlagVector | (last ? 0 : wire::kFlagMore);
      one.a0 = s.rkey;
      one.a1 = s.roffset;
      one.a2 = s.length;
      frames.emplace_back(one, std::vector<unsigned char>());
      continue;
    }
    if (table.empty()) table.reserve(std::min<size_t>(l.segs.size() - k, wire::kMaxTableEntries) * wire::kTableEntrySize);
    size_t at = table.size();
    table.resize(at + wire::kTableEntrySize);
    wire::put_table_entry(table.data() + at, {s.rkey, s.roffset, static_cast<uint32_t>(s.length)});
    if (last || table.size() == wire::kMaxTableEntries * wire::kTableEntrySize) flush(/*more=*/!last);
  }
  auto op = new_op(OpType::kRead, MemRegion{nullptr, l.total, l.where}, o);
  op->vec = std::move(b.layout);
  std::unique_lock<std::mutex> lock(mu_);
  Request r = start(op, initiated_);
  if (!status_.ok()) {
    finish(*op, status_);
  } else if (l.segs.empty()) {  // nothing to read: the peer need not hear of it
    finish(*op, Status());
  } else {
    op->id = next_op_++;
    ++counters_.reads;
    reads_[op->id] = Inbound{op, 0, l.total, 0, l.total};
    const uint64_t accepts = accepts_for(l.where);
    for (auto& [h, payload] : frames) {
      h.type = FrameType::kReadReq;
      h.id = op->id;
      h.a3 = accepts;
      push_control(h, std::move(payload));
    }
  }
  lock.unlock();
  deliver();
  return r;
}

Request EndpointImpl::post_send_vec(std::span<const MemRegion> regions, std::span<const IoPiece> pieces,
                                    uint64_t tag, OpOptions o) {
  VecBuild b = build_pieces(regions, pieces, /*recv=*/false);
  if (!b.status.ok()) return refuse_vec(OpType::kSend, b, o);
  const VecLayout& l = *b.layout;
  if (l.segs.size() <= 1) {
    MemRegion src{l.segs.empty() ? nullptr : l.segs[0].local, l.total, l.where};
    return post_send(src, tag, std::move(o));
  }
  MemRegion src{nullptr, l.total, l.where};
  auto op = new_op(OpType::kSend, src, o);
  op->vec = std::move(b.layout);
  return post_send_op(op, src, tag);
}

Request EndpointImpl::post_recv_vec(std::span<const MemRegion> regions, std::span<const IoPiece> pieces,
                                    uint64_t tag, OpOptions o) {
  VecBuild b = build_pieces(regions, pieces, /*recv=*/true);
  if (!b.status.ok()) return refuse_vec(OpType::kRecv, b, o);
  const VecLayout& l = *b.layout;
  if (l.segs.size() <= 1) {
    MemRegion dst{l.segs.empty() ? nullptr : l.segs[0].local, l.total, l.where};
    return post_recv(dst, tag, std::move(o));
  }
  MemRegion dst{nullptr, l.total, l.where};
  auto op = new_op(OpType::kRecv, dst, o);
  op->vec = std::move(b.layout);
  op->posted_tag = tag;
  return post_recv_op(op, dst);
}

const char* EndpointImpl::chunk_src(Transfer& t, uint64_t* room) const {
  const OpState& op = *t.op;
  if (!op.vec) {
    *room = op.total - t.next;
    return t.src + t.next;
  }
  const auto& segs = op.vec->segs;
  if (segs.empty()) {
    *room = 0;
    return nullptr;
  }
  while (t.seg + 1 < segs.size() && segs[t.seg].at + segs[t.seg].length <= t.next) ++t.seg;
  const VecSeg& s = segs[t.seg];
  *room = s.at + s.length - t.next;
  return s.local + (t.next - s.at);
}

Status EndpointImpl::copy_into(const OpState& op, uint64_t at, const void* src, uint64_t len) {
  if (len == 0) return Status();
  if (!op.vec) return copy_memory(op.region.sub(at, len), MemRegion{const_cast<void*>(src), len, {}});
  const VecLayout& l = *op.vec;
  if (!range_fits(at, len, l.total)) return Status(Code::kInternal, "copy past a vectored receive's end");
  const auto* from = static_cast<const unsigned char*>(src);
  for (size_t k = l.find(at); len > 0; ++k) {
    const VecSeg& s = l.segs[k];
    uint64_t in = at - s.at, n = std::min(len, s.length - in);
    if (l.where.is_device()) {
      DMX_RETURN_IF_ERROR(copy_memory(MemRegion{s.local + in, n, l.where}, MemRegion{const_cast<unsigned char*>(from), n, {}}));
    } else {
      std::memcpy(s.local + in, from, n);
    }
    from += n;
    at += n;
    len -= n;
  }
  return Status();
}

}  // namespace dmx

namespace dmx::endpoint {
bool vec_write(const OpState& op) { return op.vec != nullptr && op.type == OpType::kWrite; }
}  // namespace dmx::endpoint

namespace dmx {
Status EndpointImpl::scatter(const std::shared_ptr<void>& ctx) {
  auto b = std::static_pointer_cast<Bounce>(ctx);
  return copy_into(*b->op, b->at, b->bytes.data(), b->bytes.size());
}
}  // namespace dmx
