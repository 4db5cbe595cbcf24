// The layout of the shared region of an shm link (private to src/transport/shm).
//
//   [RegionHeader]            page 0; written once by the creator before the fd is sent
//   [Doorbells]               one "I am asleep on my eventfd" word per side
//   [RingControl x 2]         head (producer) and tail (consumer) of each direction
//   [SlotHeader x slots x 2]  per-slot chunk descriptors
//   [slot data x slots x 2]   page aligned, slot_size each
//
// Ring r carries side r -> side 1-r (side 0 = creator). Counters are monotonic 64-bit counts of
// slots; slot i of a count c is c % slots. Each side keeps its own counters privately and only
// *reads* the peer's counter from shared memory, validating it (monotonic, within the ring) before
// use; slot headers are copied into locals once and validated. The peer is untrusted.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "dmx/status.h"

namespace dmx::shm {

inline constexpr uint64_t kRegionMagic = 0x646d782d73686d31ull;  // "dmx-shm1"
inline constexpr uint32_t kRegionVersion = 1;
inline constexpr size_t kMinSlotSize = 4096, kMaxSlotSize = 64ull << 20;
inline constexpr uint32_t kMinSlots = 2, kMaxSlots = 1024;
inline constexpr int kMaxCopyThreads = 8;  // shm_copy_threads
inline constexpr size_t kMaxRegion = 4ull << 30;

struct alignas(64) SharedWord {
  std::atomic<uint64_t> v{0};
};
static_assert(sizeof(SharedWord) == 64);
static_assert(std::atomic<uint64_t>::is_always_lock_free, "cross-process atomics must be lock free");

struct RegionHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t slots;
  uint64_t slot_size;
  uint64_t total_size;
  int64_t creator_pid;
};

struct Doorbells {
  SharedWord sleeping[2];
};

struct RingControl {
  SharedWord head;  // slots published by the producer
  SharedWord tail;  // slots released by the consumer
};

// One chunk of one message. Written by the producer before it publishes head.
struct alignas(64) SlotHeader {
  std::atomic<uint64_t> msg_id;
  std::atomic<uint64_t> offset;  // of this chunk within the message
  std::atomic<uint64_t> total;   // message length (the same in every chunk of a message)
  std::atomic<uint64_t> len;     // bytes in this slot
};
static_assert(sizeof(SlotHeader) == 64);

struct Layout {
  uint32_t slots = 0;
  size_t slot_size = 0;
  size_t doorbells = 0, control = 0, headers = 0, data = 0, total = 0;
  size_t header_offset(int ring, uint32_t slot) const { return headers + (size_t(ring) * slots + slot) * sizeof(SlotHeader); }
  size_t data_offset(int ring, uint32_t slot) const { return data + (size_t(ring) * slots + slot) * slot_size; }
};

// Checks the bounds and computes the layout; kInvalidArgument naming the bad value.
Result<Layout> compute_layout(uint32_t slots, size_t slot_size);

}  // namespace dmx::shm
