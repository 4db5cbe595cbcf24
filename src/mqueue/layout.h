// mqueue/layout.h — the byte layout of Lynx-style message queues, shared by the CPU dispatcher,
// the CPU workers and the GPU kernel (plain structs, no includes beyond <cstdint>, so nvcc and
// the host compiler see the same thing).
//
// Two regions (docs/mqueue.md draws them):
//   worker memory (host or cuda:N): per-worker control words the dispatcher writes (credits),
//     request rings (server queue RX) and call-reply rings (client queue RX);
//   response memory (host, or pinned host for GPU workers): response rings (server queue TX),
//     call-request rings (client queue TX) and the stop word. The worker writes, the CPU polls
//     its own DRAM (Lynx polled the GPU with RDMA reads; reference §1.4 says why not to).
// Every ring slot is a SlotHeader and its payload; every slot has a u32 flag in a separate flag
// row. A flag holds seq + 1 of the message in the slot: written last, with release order, after
// header and payload; the reader waits for the exact value (so a stale slot is never mistaken
// for a new one and flags are never cleared).
#pragma once

#include <cstddef>
#include <cstdint>

// The layout's offset helpers run on the host and in the GPU kernel alike.
#if defined(__CUDACC__)
#define DMX_MQ_HD __host__ __device__
#else
#define DMX_MQ_HD
#endif

namespace dmx::mqueue {

// Client wire format (UDP datagram or TCP stream), little-endian, before each payload.
struct WireHeader {
  uint32_t magic;
  uint32_t len;  // payload bytes after the header
  uint64_t tag;  // the client's, echoed in the response
};
static_assert(sizeof(WireHeader) == 16);
inline constexpr uint32_t kRequestMagic = 0x584e594cu;   // "LYNX"
inline constexpr uint32_t kResponseMagic = 0x524e594cu;  // "LYNR"
inline constexpr uint32_t kErrorMagic = 0x454e594cu;     // "LYNE": payload is an error text
inline constexpr uint32_t kQueueMagic = 0x514e594cu;     // "LYNQ": asks for, and grants, a remote queue

// A remote queue granted to one dmx client (after WireHeader{kQueueMagic, sizeof(QueueGrant), 0}):
// the client writes request i (SlotHeader{len, 0} + payload) at byte (first_slot + i) mod slots
// times slot_bytes of `region`, with a notification of value i, and has at most `slots` requests
// unanswered. Answers come back as messages: WireHeader{kResponseMagic or kErrorMagic, len, i}.
struct QueueGrant {
  uint8_t region[16];  // RemoteRegion::serialize(): the ring's slots in worker memory
  uint32_t slots;
  uint32_t slot_bytes;
  uint32_t first_slot;
  uint32_t max_request;
  uint32_t max_response;
  uint32_t queue;  // the worker whose ring it is (for logs)
};
static_assert(sizeof(QueueGrant) == 40);

// Before every payload in a ring slot.
struct SlotHeader {
  uint32_t len;
  uint32_t status;  // responses and call replies: kSlotOk or an error; requests: 0
};
static_assert(sizeof(SlotHeader) == 8);
inline constexpr uint32_t kSlotOk = 0;
inline constexpr uint32_t kSlotAppError = 1;      // the app refused the request
inline constexpr uint32_t kSlotCallFailed = 2;    // the external service did not answer

// Written by the dispatcher, read by worker w (worker memory).
struct alignas(64) WorkerCtl {
  uint32_t tx_credit;    // responses of w the dispatcher has taken out of the TX ring
  uint32_t call_credit;  // call requests of w the dispatcher has taken out of the call TX ring
  uint32_t pad[14];
};
static_assert(sizeof(WorkerCtl) == 64);

inline constexpr uint32_t kMaxWorkers = 1024;
inline constexpr uint32_t kMaxSlots = 1u << 16;
inline constexpr uint32_t kMaxPayload = 16u << 20;

struct Geometry {
  uint32_t workers = 2;          // W: one CPU thread or one GPU thread block each
  uint32_t slots = 64;           // N: per worker, per server ring; a power of two
  uint32_t max_request = 4096;   // payload bytes
  uint32_t max_response = 4096;  // payload bytes
  uint32_t call_slots = 0;       // C: per worker client-queue ring; 0: no client queues
  uint32_t max_call = 0;         // payload bytes of a call request or reply
};

// Byte offsets, computed (overflow-checked) by compute_layout() in queues.h.
struct Layout {
  Geometry g;
  uint32_t rx_slot_bytes, tx_slot_bytes, call_slot_bytes;  // header + payload, 64-aligned
  uint32_t flag_row_bytes, call_flag_row_bytes;            // u32 per slot, 64-aligned rows
  // worker memory
  uint64_t ctl, rx_flags, rx_slots, crx_flags, crx_slots, worker_bytes;
  // response memory
  uint64_t tx_flags, tx_slots, ctx_flags, ctx_slots, stop, response_bytes;

  DMX_MQ_HD uint64_t rx_flag(uint32_t w, uint32_t s) const { return rx_flags + uint64_t(w) * flag_row_bytes + 4ull * s; }
  DMX_MQ_HD uint64_t rx_slot(uint32_t w, uint32_t s) const {
    return rx_slots + (uint64_t(w) * g.slots + s) * rx_slot_bytes;
  }
  DMX_MQ_HD uint64_t tx_flag(uint32_t w, uint32_t s) const { return tx_flags + uint64_t(w) * flag_row_bytes + 4ull * s; }
  DMX_MQ_HD uint64_t tx_slot(uint32_t w, uint32_t s) const {
    return tx_slots + (uint64_t(w) * g.slots + s) * tx_slot_bytes;
  }
  DMX_MQ_HD uint64_t crx_flag(uint32_t w, uint32_t s) const {
    return crx_flags + uint64_t(w) * call_flag_row_bytes + 4ull * s;
  }
  DMX_MQ_HD uint64_t crx_slot(uint32_t w, uint32_t s) const {
    return crx_slots + (uint64_t(w) * g.call_slots + s) * call_slot_bytes;
  }
  DMX_MQ_HD uint64_t ctx_flag(uint32_t w, uint32_t s) const {
    return ctx_flags + uint64_t(w) * call_flag_row_bytes + 4ull * s;
  }
  DMX_MQ_HD uint64_t ctx_slot(uint32_t w, uint32_t s) const {
    return ctx_slots + (uint64_t(w) * g.call_slots + s) * call_slot_bytes;
  }
  DMX_MQ_HD uint64_t ctl_of(uint32_t w) const { return ctl + uint64_t(w) * sizeof(WorkerCtl); }
};

// Which computation the workers run; CPU and GPU workers implement the same ones.
enum class AppKind : uint32_t {
  kXor = 1,         // response = request, every byte XOR kXorKey (echo that proves a worker ran)
  kFaceVerify = 2,  // request [u32 id][image]; the worker fetches id's reference image from the
                    // key-value service through its client queue; response [u32 match][u32 distance]
};
inline constexpr uint8_t kXorKey = 0xa5;
// Face verification: a match when the mean absolute byte difference is at most this.
inline constexpr uint32_t kFaceMatchMeanDiff = 8;

}  // namespace dmx::mqueue
