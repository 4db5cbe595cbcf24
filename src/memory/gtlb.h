// The GTLB: a bounded translation cache from a virtual address to the allocation (or registered
// region) that holds it, after FpgaNIC's GPU TLB (seed 003; reference/accelerator_centric.md §3).
//
// Main entries cover 2 MiB pages that one allocation spans whole. A page that is not (the ends of
// an allocation, cudaMalloc's small allocations packed into one page, cuMem maps of 64 KiB
// granularity, PyTorch's expandable segments) gets a complementary block of 32 cells of 64 KiB;
// a cell names the last allocation filled into it. A hit is a translation whose allocation holds
// the whole range looked up; anything else misses, and the owner resolves the address (a driver
// call, its registration table) and fills. Both tables are bounded and evict by a clock.
//
// The cache never decides whether memory still exists: its owner invalidates on deregistration
// and checks `generation` (a CUDA buffer id) where memory can be freed behind dmx. Not
// thread-safe: its owner serialises calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace dmx {

struct GtlbEntry {
  uintptr_t base = 0;       // the allocation's first byte
  uint64_t size = 0;
  uint64_t generation = 0;  // what the owner checks on a hit (CUDA buffer id; 0 where unused)
  uint64_t value = 0;       // the owner's handle: a registration key, an export's index
  // Whether [addr, addr + len) lies inside (overflow-safe).
  bool holds(uintptr_t addr, uint64_t len) const {
    return addr >= base && addr - base <= size && len <= size - (addr - base);
  }
  bool overlaps(uintptr_t b, uint64_t n) const {
    return b < base ? base - b < n : b - base < size;
  }
};

struct GtlbCounters {
  uint64_t hits = 0, misses = 0, fills = 0, evictions = 0, invalidations = 0;
  size_t main_entries = 0;  // 2 MiB pages held now
  size_t comp_blocks = 0;   // complementary blocks held now
};

class Gtlb {
 public:
  static constexpr unsigned kPageShift = 21;  // 2 MiB
  static constexpr unsigned kCellShift = 16;  // 64 KiB
  static constexpr unsigned kCells = 1u << (kPageShift - kCellShift);
  struct Limits {
    size_t main_entries = 16384;  // 32 GiB of whole pages
    size_t comp_blocks = 2048;    // the paper's complementary entries
  };

  explicit Gtlb(Limits limits);
  Gtlb() : Gtlb(Limits{}) {}
  ~Gtlb();
  Gtlb(const Gtlb&) = delete;
  Gtlb& operator=(const Gtlb&) = delete;

  // The translation of [addr, addr + len), or nothing (a miss).
  std::optional<GtlbEntry> lookup(uintptr_t addr, uint64_t len);
  // Caches `e` for the pages [addr, addr + len) touches (a TLB fills what missed, not the whole
  // allocation); ignored unless e.holds(addr, len).
  void fill(const GtlbEntry& e, uintptr_t addr, uint64_t len);
  // Drops every translation of an allocation overlapping [base, base + size); how many entries
  // (pages and cells) went.
  size_t invalidate(uintptr_t base, uint64_t size);
  void clear();
  GtlbCounters counters() const;

 private:
  // Open addressing with linear probing and backward-shift deletion; keys are page + 1 (0: empty).
  // A slot's `ref` is the clock's second chance, set on each hit.
  template <typename V>
  class Table {
   public:
    struct Slot {
      uint64_t key = 0;
      bool ref = false;
      V value{};
    };
    explicit Table(size_t limit);
    ~Table();
    Table(const Table&) = delete;
    Table& operator=(const Table&) = delete;
    V* find(uint64_t page);
    // The slot for `page`, made if absent; when the table is at its limit, first evicts one other
    // page (its slot copied to *evicted; key 0 when none went).
    V& emplace(uint64_t page, bool* made, Slot* evicted);
    bool erase(uint64_t page);
    size_t size() const { return count_; }
    size_t limit() const { return limit_; }
    template <typename F>
    void for_each(F&& f) {
      for (size_t i = 0; i < cap_; ++i)
        if (slots_[i].key) f(slots_[i].key - 1, slots_[i].value);
    }
    void clear();

   private:
    size_t home(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift_; }
    void erase_at(size_t i);
    void evict(Slot* evicted);
    const size_t limit_;
    unsigned shift_ = 0;
    Slot* slots_ = nullptr;  // mapped on first emplace, in huge pages where the kernel allows
    size_t cap_ = 0;
    size_t count_ = 0;
    size_t hand_ = 0;
  };
  struct Block {
    uint32_t used = 0;  // bit per cell
    GtlbEntry cells[kCells];
  };

  void fill_cells(const GtlbEntry& e, uint64_t page);
  size_t invalidate_page(uint64_t page, uintptr_t base, uint64_t size);

  Table<GtlbEntry> main_;
  Table<uint32_t> comp_;       // page -> index in blocks_
  std::vector<Block> blocks_;  // grows to the limit, then reused
  std::vector<uint32_t> free_blocks_;
  GtlbCounters counters_;
};

}  // namespace dmx
