#include "memory/gtlb.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <new>

namespace dmx {

template <typename V>
Gtlb::Table<V>::Table(size_t limit) : limit_(std::max<size_t>(limit, 1)) {}

template <typename V>
Gtlb::Table<V>::~Table() {
  if (slots_) munmap(slots_, cap_ * sizeof(Slot));
}

template <typename V>
V* Gtlb::Table<V>::find(uint64_t page) {
  if (!slots_) return nullptr;
  const uint64_t key = page + 1;
  const size_t mask = cap_ - 1;
  for (size_t i = home(key);; i = (i + 1) & mask) {
    Slot& s = slots_[i];
    if (s.key == key) {
      s.ref = true;
      return &s.value;
    }
    if (s.key == 0) return nullptr;
  }
}

template <typename V>
V& Gtlb::Table<V>::emplace(uint64_t page, bool* made, Slot* evicted) {
  *evicted = Slot{};
  if (!slots_) {
    // At most half full: probes stay short. Zeroed pages are empty slots; huge pages spare a
    // random lookup in a large table its TLB misses (they cost most in a VM).
    const size_t cap = std::bit_ceil(limit_ * 2);
    void* p = mmap(nullptr, cap * sizeof(Slot), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    madvise(p, cap * sizeof(Slot), MADV_HUGEPAGE);  // advice only: fine if refused
    slots_ = static_cast<Slot*>(p);
    cap_ = cap;
    shift_ = 64 - std::countr_zero(cap);  // cap >= 2, so shift_ <= 63
  }
  if (V* v = find(page)) {
    *made = false;
    return *v;
  }
  if (count_ >= limit_) evict(evicted);
  const uint64_t key = page + 1;
  const size_t mask = cap_ - 1;
  size_t i = home(key);
  while (slots_[i].key != 0) i = (i + 1) & mask;
  slots_[i] = Slot{key, true, V{}};  // filled after a miss: it counts as used
  ++count_;
  *made = true;
  return slots_[i].value;
}

template <typename V>
bool Gtlb::Table<V>::erase(uint64_t page) {
  if (!slots_) return false;
  const uint64_t key = page + 1;
  const size_t mask = cap_ - 1;
  for (size_t i = home(key);; i = (i + 1) & mask) {
    if (slots_[i].key == key) {
      erase_at(i);
      return true;
    }
    if (slots_[i].key == 0) return false;
  }
}

// Backward-shift deletion: later slots of the same probe run move up, so no tombstones build up.
template <typename V>
void Gtlb::Table<V>::erase_at(size_t i) {
  const size_t mask = cap_ - 1;
  for (size_t j = (i + 1) & mask; slots_[j].key != 0; j = (j + 1) & mask) {
    const size_t k = home(slots_[j].key);
    // Slot j may fill the hole at i unless its home lies cyclically in (i, j].
    const bool home_between = i <= j ? (k > i && k <= j) : (k > i || k <= j);
    if (!home_between) {
      slots_[i] = slots_[j];
      i = j;
    }
  }
  slots_[i] = Slot{};
  --count_;
}

// The clock: the first occupied slot from the hand without its second chance goes.
template <typename V>
void Gtlb::Table<V>::evict(Slot* evicted) {
  const size_t mask = cap_ - 1;
  for (;; hand_ = (hand_ + 1) & mask) {
    Slot& s = slots_[hand_];
    if (s.key == 0) continue;
    if (s.ref) {
      s.ref = false;
      continue;
    }
    *evicted = s;
    erase_at(hand_);
    return;
  }
}

template <typename V>
void Gtlb::Table<V>::clear() {
  std::fill(slots_, slots_ + cap_, Slot{});
  count_ = 0;
  hand_ = 0;
}

Gtlb::Gtlb(Limits limits) : main_(limits.main_entries), comp_(limits.comp_blocks) {}

Gtlb::~Gtlb() = default;

std::optional<GtlbEntry> Gtlb::lookup(uintptr_t addr, uint64_t len) {
  const uint64_t page = addr >> kPageShift;
  if (const GtlbEntry* e = main_.find(page); e && e->holds(addr, len)) {
    ++counters_.hits;
    return *e;
  }
  if (const uint32_t* b = comp_.find(page)) {
    const Block& block = blocks_[*b];
    const unsigned cell = (addr >> kCellShift) & (kCells - 1);
    if ((block.used >> cell & 1) && block.cells[cell].holds(addr, len)) {
      ++counters_.hits;
      return block.cells[cell];
    }
  }
  ++counters_.misses;
  return std::nullopt;
}

void Gtlb::fill(const GtlbEntry& e, uintptr_t addr, uint64_t len) {
  if (e.size == 0 || e.size - 1 > UINTPTR_MAX - e.base || !e.holds(addr, len)) return;
  ++counters_.fills;
  const uint64_t first = addr >> kPageShift;
  uint64_t last = (addr + (len ? len - 1 : 0)) >> kPageShift;
  last = std::min(last, first + main_.limit() - 1);  // more would only evict its own pages
  // The first page last: lookups go by it, and this fill's own evictions must not take it.
  for (uint64_t page = last + 1; page-- > first;) {
    const uintptr_t start = page << kPageShift;
    const bool whole = e.holds(start, uint64_t{1} << kPageShift);
    if (!whole) {
      fill_cells(e, page);
      continue;
    }
    bool made = false;
    Table<GtlbEntry>::Slot evicted;
    main_.emplace(page, &made, &evicted) = e;
    if (evicted.key) ++counters_.evictions;
  }
}

void Gtlb::fill_cells(const GtlbEntry& e, uint64_t page) {
  bool made = false;
  Table<uint32_t>::Slot evicted;
  uint32_t& index = comp_.emplace(page, &made, &evicted);
  if (made) {
    if (evicted.key) {  // the evicted page's block is ours now
      ++counters_.evictions;
      index = evicted.value;
    } else if (!free_blocks_.empty()) {
      index = free_blocks_.back();
      free_blocks_.pop_back();
    } else {
      index = static_cast<uint32_t>(blocks_.size());
      blocks_.emplace_back();
    }
    blocks_[index].used = 0;
  }
  Block& block = blocks_[index];
  const uintptr_t start = page << kPageShift;
  for (unsigned c = 0; c < kCells; ++c) {
    const uintptr_t cell = start + (uintptr_t{c} << kCellShift);
    if (!e.overlaps(cell, uint64_t{1} << kCellShift)) continue;
    block.cells[c] = e;
    block.used |= 1u << c;
  }
}

size_t Gtlb::invalidate(uintptr_t base, uint64_t size) {
  if (size == 0) return 0;
  size_t gone = 0;
  const uint64_t first = base >> kPageShift;
  const uint64_t last = (size - 1 > UINTPTR_MAX - base ? UINTPTR_MAX : base + (size - 1)) >> kPageShift;
  if (last - first < main_.size() + comp_.size()) {
    for (uint64_t page = first; page <= last; ++page) gone += invalidate_page(page, base, size);
  } else {  // a range wider than the cache: walk the cache instead
    std::vector<uint64_t> pages;
    main_.for_each([&](uint64_t page, const GtlbEntry&) { if (page >= first && page <= last) pages.push_back(page); });
    comp_.for_each([&](uint64_t page, uint32_t) { if (page >= first && page <= last) pages.push_back(page); });
    for (uint64_t page : pages) gone += invalidate_page(page, base, size);
  }
  counters_.invalidations += gone;
  return gone;
}

size_t Gtlb::invalidate_page(uint64_t page, uintptr_t base, uint64_t size) {
  size_t gone = 0;
  if (const GtlbEntry* e = main_.find(page); e && e->overlaps(base, size)) {
    main_.erase(page);
    ++gone;
  }
  if (const uint32_t* b = comp_.find(page)) {
    Block& block = blocks_[*b];
    for (unsigned c = 0; c < kCells; ++c) {
      if ((block.used >> c & 1) && block.cells[c].overlaps(base, size)) {
        block.used &= ~(1u << c);
        ++gone;
      }
    }
    if (block.used == 0) {
      free_blocks_.push_back(*b);
      comp_.erase(page);
    }
  }
  return gone;
}

void Gtlb::clear() {
  main_.clear();
  comp_.clear();
  blocks_.clear();
  free_blocks_.clear();
}

GtlbCounters Gtlb::counters() const {
  GtlbCounters c = counters_;
  c.main_entries = main_.size();
  c.comp_blocks = comp_.size();
  return c;
}

}  // namespace dmx
