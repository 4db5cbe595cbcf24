// Endpoint: vectored operations' lists. A list is checked whole before anything is posted (every
// index, offset and length against its region, overflow-safe; destinations must not overlap) and
// turned into a VecLayout: the operation's bytes as segments, adjacent entries merged. A long
// write or read list is checked and laid out in parts by a crew of threads.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <unordered_map>

#include "core/checked.h"
#include "core/copy_crew.h"
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
  // As if o's ranges had been added after these.
  void merge(const Shape& o) {
    if (o.count == 0) return;
    if (count == 0) {
      *this = o;
      return;
    }
    uniform = uniform && o.uniform && o.space == space && o.len == len;
    count += o.count;
    lo = std::min(lo, o.lo);
    hi = std::max(hi, o.hi);
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
// `bits`: whether to try the bitmap first (false: it has been tried).
template <typename Dest>
int64_t find_overlap(const Shape& shape, size_t n, const Dest& dest, uint32_t* other, bool bits = true) {
  if (bits && distinct_blocks(shape, n, dest)) return -1;
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
    return Status(Code::kInvalidArgument,
                  fmt::format("local region {} is {}, an earlier one {}: one memory kind per list", k,
                              to_string(r.where), to_string(*where)));
  if (!*have_where) {
    if (Status s = mem_available(r.where); !s.ok())
      return Status(s.code(), fmt::format("local region {}: {}", k, s.message()));
    *where = r.where;
    *have_where = true;
  }
  seen[k] = 1;
  return Status();
}

// Entry i's destination range, false for an empty entry (every entry is valid by then).
auto destinations(std::span<const MemRegion> local, std::span<const RemoteRegion> remote,
                  std::span<const IoEntry> entries, bool write) {
  return [=](size_t i, Span* d) {
    const IoEntry& e = entries[i];
    if (e.length == 0) return false;
    uint64_t begin = write ? e.remote_offset : reinterpret_cast<uintptr_t>(local[e.local].ptr) + e.local_offset;
    *d = Span{write ? remote[e.remote].key : 0, begin, begin + e.length, static_cast<uint32_t>(i)};
    return true;
  };
}

// Refuses a list whose destinations overlap, naming the first such entry. `bits`: as find_overlap's.
VecBuild check_overlap(std::span<const MemRegion> local, std::span<const RemoteRegion> remote,
                       std::span<const IoEntry> entries, bool write, const Shape& shape, bool bits) {
  uint32_t other = 0;
  if (int64_t bad = find_overlap(shape, entries.size(), destinations(local, remote, entries, write), &other, bits);
      bad >= 0)
    return refuse(bad, Code::kInvalidArgument,
                  fmt::format("its {} range overlaps entry {}'s (destinations must not overlap)",
                              write ? "remote" : "local", other));
  return VecBuild();
}

// A write or read list checked and laid out by the calling thread alone.
VecBuild build_alone(std::span<const MemRegion> local, std::span<const RemoteRegion> remote,
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
      return refuse(
          idx, Code::kOutOfRange,
          fmt::format("[{}, +{}) lies outside local region {} of {} bytes", e.local_offset, e.length, e.local, l.size));
    if (!range_fits(e.remote_offset, e.length, r.size))
      return refuse(idx, Code::kOutOfRange,
                    fmt::format("[{}, +{}) lies outside remote region {} of {} bytes", e.remote_offset, e.length,
                                e.remote, r.size));
    if (e.length == 0) continue;
    auto sum = checked_add(total, e.length);
    if (!sum) return refuse(idx, Code::kOutOfRange, "the list's total length exceeds 2^64 bytes");
    char* p = static_cast<char*>(l.ptr) + e.local_offset;
    if (write)
      shape.add(r.key, e.remote_offset, e.length);
    else
      shape.add(0, reinterpret_cast<uintptr_t>(p), e.length);
    auto& segs = layout->segs;
    if (!segs.empty() && segs.back().local + segs.back().length == p && segs.back().rkey == r.key &&
        segs.back().roffset + segs.back().length == e.remote_offset) {
      segs.back().length += e.length;
    } else {
      segs.push_back(VecSeg{total, p, e.length, r.key, e.remote_offset});
    }
    total = *sum;
  }
  if (VecBuild b = check_overlap(local, remote, entries, write, shape, /*bits=*/true); !b.status.ok()) return b;
  layout->total = total;
  if (layout->segs.capacity() > 2 * layout->segs.size() + 64) layout->segs.shrink_to_fit();
  VecBuild b;
  b.layout = std::move(layout);
  return b;
}

// One part of a long list: what the first pass found in entries [begin, end), each entry checked
// and the adjacent ones merged among themselves.
struct alignas(64) Part {  // a line of its own: each is written by one thread
  size_t begin = 0, end = 0;
  bool ok = true;  // false: a bad entry (the list is then checked again alone, to name it)
  MemSpec where;
  bool have_where = false;
  Shape shape;
  uint64_t total = 0;      // its bytes
  size_t segs = 0;         // segments it makes alone
  VecSeg first{}, last{};  // its first and last, alone (`at` unset)
  // Set between the passes: where its bytes and its first segment go, and whether that segment
  // continues the one before (its bytes are then added to that one).
  uint64_t at = 0;
  size_t base = 0;
  bool joins = false;
};

bool continues(const VecSeg& s, const VecSeg& next) {
  return s.local + s.length == next.local && s.rkey == next.rkey && s.roffset + s.length == next.roffset;
}

// The first pass over a part: build_alone's checks, without the messages.
void check_part(std::span<const MemRegion> local, std::span<const RemoteRegion> remote,
                std::span<const IoEntry> entries, bool write, Part& p) {
  uint32_t checked = UINT32_MAX;  // the local region last checked
  VecSeg cur{};
  for (size_t i = p.begin; i < p.end; ++i) {
    const IoEntry& e = entries[i];
    if (e.local >= local.size() || e.remote >= remote.size()) {
      p.ok = false;
      return;
    }
    const MemRegion& l = local[e.local];
    if (e.local != checked) {
      if ((l.size > 0 && l.ptr == nullptr) || (p.have_where && !(l.where == p.where))) {
        p.ok = false;
        return;
      }
      p.where = l.where;
      p.have_where = true;
      checked = e.local;
    }
    const RemoteRegion& r = remote[e.remote];
    if (!range_fits(e.local_offset, e.length, l.size) || !range_fits(e.remote_offset, e.length, r.size)) {
      p.ok = false;
      return;
    }
    if (e.length == 0) continue;
    auto sum = checked_add(p.total, e.length);
    if (!sum) {
      p.ok = false;
      return;
    }
    p.total = *sum;
    char* ptr = static_cast<char*>(l.ptr) + e.local_offset;
    if (write)
      p.shape.add(r.key, e.remote_offset, e.length);
    else
      p.shape.add(0, reinterpret_cast<uintptr_t>(ptr), e.length);
    VecSeg next{0, ptr, e.length, r.key, e.remote_offset};
    if (p.segs > 0 && continues(cur, next)) {
      cur.length += e.length;
      continue;
    }
    if (p.segs == 1) p.first = cur;
    ++p.segs;
    cur = next;
  }
  if (p.segs == 1) p.first = cur;
  p.last = cur;
}

// The second pass over a part: its segments written in place, from segs[p.base] on. A first
// segment that continues the one before is left to the caller (that one may be another part's).
void lay_part(std::span<const MemRegion> local, std::span<const RemoteRegion> remote, std::span<const IoEntry> entries,
              const Part& p, VecSeg* segs) {
  size_t runs = 0;
  uint64_t at = p.at;
  VecSeg cur{};
  auto put = [&] {
    if (runs > 1 || !p.joins) segs[p.base + runs - 1] = cur;
  };
  for (size_t i = p.begin; i < p.end; ++i) {
    const IoEntry& e = entries[i];
    if (e.length == 0) continue;
    VecSeg next{at, static_cast<char*>(local[e.local].ptr) + e.local_offset, e.length, remote[e.remote].key,
                e.remote_offset};
    at += e.length;
    if (runs > 0 && continues(cur, next)) {
      cur.length += e.length;
      continue;
    }
    if (runs > 0) put();
    ++runs;
    cur = next;
  }
  if (runs > 0) put();
}

// A list of at least kCrewEntries, in parts of kPartEntries: the first pass checks the parts at
// once; they are joined in order (where each one's bytes and segments go); the second pass writes
// the segments in place while one thread checks the destinations' blocks. A list the first pass
// refuses is checked again alone, which names its first bad entry as build_alone does.
constexpr size_t kPartEntries = 4096;
static_assert(kCrewEntries >= 2 * kPartEntries);

VecBuild build_in_parts(std::span<const MemRegion> local, std::span<const RemoteRegion> remote,
                        std::span<const IoEntry> entries, bool write, CopyCrew& crew) {
  const size_t n = entries.size(), count = (n + kPartEntries - 1) / kPartEntries;
  std::vector<Part> parts(count);
  for (size_t k = 0; k < count; ++k) {
    parts[k].begin = k * kPartEntries;
    parts[k].end = std::min(n, parts[k].begin + kPartEntries);
  }
  crew.run(count, [&](size_t k) { check_part(local, remote, entries, write, parts[k]); });
  auto alone = [&] { return build_alone(local, remote, entries, write); };
  auto layout = std::make_shared<VecLayout>();
  bool have_where = false;
  Shape shape;
  uint64_t total = 0;
  size_t segs = 0;
  const VecSeg* before = nullptr;  // the last segment so far
  for (Part& p : parts) {
    if (!p.ok) return alone();
    if (p.have_where) {
      if (have_where && !(p.where == layout->where)) return alone();
      layout->where = p.where;
      have_where = true;
    }
    shape.merge(p.shape);
    p.at = total;
    auto sum = checked_add(total, p.total);
    if (!sum) return alone();
    total = *sum;
    if (p.segs == 0) continue;
    p.joins = before != nullptr && continues(*before, p.first);
    p.base = p.joins ? segs - 1 : segs;
    segs += p.segs - (p.joins ? 1 : 0);
    before = &p.last;
  }
  if (have_where && !mem_available(layout->where).ok()) return alone();
  layout->segs.resize(segs);
  layout->total = total;
  auto dest = destinations(local, remote, entries, write);
  bool distinct = false;
  crew.run(count + 1, [&](size_t k) {
    if (k == 0)
      distinct = distinct_blocks(shape, n, dest);
    else
      lay_part(local, remote, entries, parts[k - 1], layout->segs.data());
  });
  for (const Part& p : parts)
    if (p.joins) layout->segs[p.base].length += p.first.length;
  if (!distinct)
    if (VecBuild b = check_overlap(local, remote, entries, write, shape, /*bits=*/false); !b.status.ok()) return b;
  VecBuild b;
  b.layout = std::move(layout);
  return b;
}

}  // namespace

VecBuild build_one_sided(std::span<const MemRegion> local, std::span<const RemoteRegion> remote,
                         std::span<const IoEntry> entries, bool write, CopyCrew* crew) {
  if (crew == nullptr || crew->threads() < 2 || entries.size() < kCrewEntries || entries.size() > kMaxIoEntries)
    return build_alone(local, remote, entries, write);
  return build_in_parts(local, remote, entries, write, *crew);
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
    if (!segs.empty() && segs.back().local + segs.back().length == p)
      segs.back().length += e.length;
    else
      segs.push_back(VecSeg{total, p, e.length, 0, 0});
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

}  // namespace dmx
