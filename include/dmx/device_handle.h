// dmx/device_handle.h — what a CUDA kernel shares with the endpoint that moves its data
// (docs/gpu-push.md). No CUDA headers: the host side includes it too.
//
// A DeviceHandle (Endpoint::device_handle) is a plain struct a kernel takes by value. It names a
// ring of descriptors and a control block in pinned host memory that both the GPU and the host
// reach at the same address, and a ticket counter in device memory. A kernel posts an operation
// by taking a ticket (a device atomic), writing the descriptor into slot ticket % slots and
// publishing it last (its `seq` = ticket + 1, a release store at system scope, after a system
// fence). A host thread of the endpoint takes published descriptors in ticket order, posts the
// operations (send, or one-sided write with an optional notification), and when each completes
// advances `completed` (in ticket order). The kernel waits for `completed > ticket`, reading the
// error word too; every wait has a deadline (`timeout_ns`, read off %globaltimer), so a kernel
// never spins forever on a dead peer or a stopped host.
//
// The protocol functions below are written once for both sides (`__host__ __device__` under
// nvcc): the kernel calls them through dmx/device.cuh, and the CPU tests play the kernel's part
// with the same code and the same memory orders from a host thread.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DMX_HD __host__ __device__
#else
#define DMX_HD
#endif

#if !defined(__CUDA_ARCH__)
#include <atomic>
#include <chrono>
#include <thread>
#endif

namespace dmx {

// What a descriptor asks for.
enum class DeviceOpKind : uint32_t {
  kSend = 1,    // Endpoint::send(source, tag)
  kWrite = 2,   // Endpoint::write(source, remote, offset), notifying when kNotify is set
  kDirect = 3,  // told afterwards: the kernel stored `length` bytes into a window itself (direct put);
                // the host counts it and completes the ticket, posting nothing
};
inline constexpr uint32_t kDeviceNotify = 1;  // DeviceDescriptor::flags: a write delivers notify_value

// One slot of the ring (64 bytes, one cache line). The kernel writes every field, then `seq`.
struct DeviceDescriptor {
  uint64_t seq;           // ticket + 1 once published; anything else: not (yet) this ticket's
  uint32_t op;            // a DeviceOpKind
  uint32_t flags;         // kDeviceNotify
  uint64_t addr;          // the source: device memory of the handle's GPU
  uint64_t length;        // bytes
  uint64_t tag;           // send: the tag; write: the remote region's key
  uint64_t remote_size;   // write: the remote region's size (as RemoteRegion carries it)
  uint64_t offset;        // write: where in the remote region
  uint64_t notify_value;  // write with kDeviceNotify: delivered to the target after landing
};
static_assert(sizeof(DeviceDescriptor) == 64, "one cache line per descriptor");

// Written by the host, read by the kernel. Each word on its own line (no false sharing with the
// host's polling of the ring).
struct DeviceControl {
  alignas(64) uint64_t consumed;  // descriptors the host has taken: slots below it are free again
  alignas(64) uint64_t completed;       // operations completed, in ticket order (release)
  alignas(64) uint64_t failed_ticket;   // the first ticket that failed; ~0 while none did
  uint32_t error;                       // 0, or the dmx::Code that failed it (sticky)
  uint32_t reserved0;
  alignas(64) uint64_t notifications;   // notifications the peer's writes delivered here, a count
  uint64_t last_notification;           // the value of the latest one (written before the count)
};
static_assert(sizeof(DeviceControl) == 256, "four cache lines");

// A kernel takes this by value. Valid while its endpoint lives; the endpoint's close sets
// `error` (kClosed) so that waiting kernels return.
struct DeviceHandle {
  DeviceDescriptor* ring = nullptr;      // `slots` descriptors, pinned host memory
  DeviceControl* control = nullptr;      // pinned host memory
  unsigned long long* tickets = nullptr; // device memory: [0] the next ticket, [1] post_direct's copy of `consumed`
  uint32_t slots = 0;                    // a power of two
  int32_t device = -1;                   // the CUDA device the handle is for
  uint64_t timeout_ns = 0;               // how long one device call may spin (0: 1 s)
  bool valid() const { return ring != nullptr; }
};

// The peer's region a kernel writes into (RemoteRegion's key and size).
struct DeviceRemote {
  uint64_t key = 0;
  uint64_t size = 0;
};

// A peer's GPU memory mapped into this process (Endpoint::import_device_window, cuda_ipc between
// two processes of one host): a kernel of the handle's GPU stores into [base, base + size) itself,
// over NVLink or PCIe P2P, with no copy engine and no host (direct puts, dmx/device.cuh).
struct DeviceWindow {
  uint64_t base = 0;  // the mapped address in this process
  uint64_t size = 0;
};

// Results of the device calls: >= 0 is a ticket (post) or success (0); < 0 is -code with these
// values of dmx::Code (status.h), checked there by static_assert.
inline constexpr int kDeviceOk = 0;
inline constexpr int kDeviceInvalid = 1;     // Code::kInvalidArgument: a bad call (length, handle)
inline constexpr int kDeviceTimeout = 4;     // Code::kTimeout: the deadline passed first
inline constexpr int kDeviceClosed = 6;      // Code::kClosed: the endpoint was closed
inline constexpr int kDevicePeerFailed = 13; // Code::kPeerFailed: the peer died or went silent

namespace device_ring {

// --- Memory access: the same orders on the GPU (system scope) and on the host. ---

// On the GPU: ld.acquire.sys / st.release.sys (sm_70 and later), generic addresses (the ring is
// mapped host memory). T: a 4- or 8-byte integer.
template <class T>
DMX_HD inline T load_acquire(T* p) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "4- or 8-byte words");
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 8) {
    unsigned long long v;
    asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return static_cast<T>(v);
  } else {
    unsigned v;
    asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return static_cast<T>(v);
  }
#else
  return std::atomic_ref<T>(*p).load(std::memory_order_acquire);
#endif
}

template <class T>
DMX_HD inline void store_release(T* p, T v) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "4- or 8-byte words");
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 8) {
    asm volatile("st.release.sys.u64 [%0], %1;" : : "l"(p), "l"(static_cast<unsigned long long>(v)) : "memory");
  } else {
    asm volatile("st.release.sys.u32 [%0], %1;" : : "l"(p), "r"(static_cast<unsigned>(v)) : "memory");
  }
#else
  std::atomic_ref<T>(*p).store(v, std::memory_order_release);
#endif
}

// After a barrier that followed an acquire by one thread: every thread's later loads see what
// that acquire made visible (fence.acq_rel.sys).
DMX_HD inline void fence_acquire_system() {
#if defined(__CUDA_ARCH__)
  asm volatile("fence.acq_rel.sys;" : : : "memory");
#else
  std::atomic_thread_fence(std::memory_order_acquire);
#endif
}

// The fence the contract asks for before publishing: every store this thread made (to device
// memory included) is visible system-wide before anything it stores next.
DMX_HD inline void fence_system() {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

DMX_HD inline uint64_t now_ns() {
#if defined(__CUDA_ARCH__)
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
#endif
}

DMX_HD inline void pause() {
#if defined(__CUDA_ARCH__)
  __nanosleep(100);
#else
  std::this_thread::yield();
#endif
}

DMX_HD inline uint64_t take_ticket(const DeviceHandle& h) {
#if defined(__CUDA_ARCH__)
  return atomicAdd(h.tickets, 1ull);  // device scope: every poster runs on the handle's GPU
#else
  return std::atomic_ref<unsigned long long>(*h.tickets).fetch_add(1ull, std::memory_order_relaxed);
#endif
}

DMX_HD inline uint64_t deadline_of(const DeviceHandle& h) {
  return now_ns() + (h.timeout_ns == 0 ? 1000000000ull : h.timeout_ns);
}

// The error word, or 0: a peer that died or an endpoint that closed shows here.
DMX_HD inline int error(const DeviceHandle& h) {
  return static_cast<int>(load_acquire(&h.control->error));
}

// Posts one descriptor (one thread). Returns its ticket, or -code: -kDeviceInvalid for a bad
// handle, the error word once set (it is sticky: after any failure a handle posts nothing more), -kDeviceTimeout when no slot came free in
// time (the host stopped taking descriptors). The caller must have fenced (fence_system) the
// source bytes first: the host may copy them as soon as `seq` is seen.
DMX_HD inline int64_t post(const DeviceHandle& h, DeviceOpKind op, uint32_t flags, const void* src, uint64_t length,
                           uint64_t tag, uint64_t remote_size, uint64_t offset, uint64_t notify_value) {
  if (h.ring == nullptr || h.control == nullptr || h.tickets == nullptr || h.slots == 0) return -kDeviceInvalid;
  if (int e = error(h)) return -e;
  const uint64_t ticket = take_ticket(h);
  const uint64_t deadline = deadline_of(h);
  // A slot is free once the host took the descriptor `slots` tickets before.
  while (ticket - load_acquire(&h.control->consumed) >= h.slots) {
    if (int e = error(h)) return -e;
    if (now_ns() > deadline) return -kDeviceTimeout;
    pause();
  }
  DeviceDescriptor* d = &h.ring[ticket & (h.slots - 1)];
  d->op = static_cast<uint32_t>(op);
  d->flags = flags;
  d->addr = reinterpret_cast<uint64_t>(src);
  d->length = length;
  d->tag = tag;
  d->remote_size = remote_size;
  d->offset = offset;
  d->notify_value = notify_value;
  fence_system();  // the fields before the seq, also for a host that reads them without acquire
  store_release(&d->seq, ticket + 1);
  return static_cast<int64_t>(ticket);
}

// Waits until the operation of `ticket` completed (the source may be reused; a write has landed
// at the target). 0, or -code: the operation's own failure, the channel's (peer dead, endpoint
// closed), or -kDeviceTimeout at the handle's deadline (the operation may still complete).
DMX_HD inline int wait(const DeviceHandle& h, uint64_t ticket) {
  if (h.control == nullptr) return -kDeviceInvalid;
  const uint64_t deadline = deadline_of(h);
  for (;;) {
    // `completed` first: the host writes failed_ticket, then error, before `completed` moves
    // past a failed ticket, so a ticket seen completed with no error covering it succeeded.
    uint64_t done = load_acquire(&h.control->completed);
    int e = error(h);
    if (e != 0 && ticket >= load_acquire(&h.control->failed_ticket)) return -e;
    if (done > ticket) return kDeviceOk;
    if (now_ns() > deadline) return -kDeviceTimeout;
    pause();
  }
}

// Waits until at least `count` notifications have arrived on this endpoint (counted from the
// handle's creation); *value (optional) gets the latest one's value. 0 or -code as wait().
DMX_HD inline int wait_notifications(const DeviceHandle& h, uint64_t count, uint64_t* value) {
  if (h.control == nullptr) return -kDeviceInvalid;
  const uint64_t deadline = deadline_of(h);
  for (;;) {
    if (load_acquire(&h.control->notifications) >= count) {
      if (value != nullptr) *value = load_acquire(&h.control->last_notification);
      return kDeviceOk;
    }
    if (int e = error(h)) return -e;
    if (now_ns() > deadline) return -kDeviceTimeout;
    pause();
  }
}

// --- Direct puts (DeviceWindow): the kernel stores the bytes and a signal word itself. ---

// Whether [offset, offset + length) lies inside the window (overflow-safe).
DMX_HD inline bool window_holds(const DeviceWindow& w, uint64_t offset, uint64_t length) {
  return w.base != 0 && length <= w.size && offset <= w.size - length;
}

// The signal word at `offset` of window `w`: 8 bytes, 8-byte aligned, inside it; null otherwise.
DMX_HD inline uint64_t* signal_word(const DeviceWindow& w, uint64_t offset) {
  if (!window_holds(w, offset, 8) || ((w.base + offset) & 7) != 0) return nullptr;
  return reinterpret_cast<uint64_t*>(w.base + offset);
}

// Publishes a direct put (one thread, after every thread that stored the bytes fenced at system
// scope and met it at a barrier): the signal word gets `value` with a release store at system
// scope, so a reader that acquires it (wait_signal) sees the bytes. Then tells the host
// (DeviceOpKind::kDirect, for its counts: post_direct) and returns that descriptor's ticket or
// -code; the signal is already set either way.
// Telling the host is kept off the peer's path and short: no look at the error word (the host
// completes a kDirect ticket whatever state it is in), and the host's `consumed` is read across
// PCIe only when a copy of it in device memory (tickets[1], the largest value any poster saw) says
// the ring may be full.
DMX_HD inline int64_t post_direct(const DeviceHandle& h, const void* src, uint64_t length, uint64_t value) {
  if (h.ring == nullptr || h.control == nullptr || h.tickets == nullptr || h.slots == 0) return -kDeviceInvalid;
  const uint64_t ticket = take_ticket(h);
  unsigned long long* seen = h.tickets + 1;
#if defined(__CUDA_ARCH__)
  uint64_t consumed = *reinterpret_cast<volatile unsigned long long*>(seen);
#else
  uint64_t consumed = std::atomic_ref<unsigned long long>(*seen).load(std::memory_order_relaxed);
#endif
  if (ticket - consumed >= h.slots) {
    const uint64_t deadline = deadline_of(h);
    while (ticket - (consumed = load_acquire(&h.control->consumed)) >= h.slots) {
      if (int e = error(h)) return -e;
      if (now_ns() > deadline) return -kDeviceTimeout;
      pause();
    }
#if defined(__CUDA_ARCH__)
    atomicMax(seen, static_cast<unsigned long long>(consumed));
#else
    std::atomic_ref<unsigned long long> a(*seen);
    for (unsigned long long old = a.load(); old < consumed && !a.compare_exchange_weak(old, consumed);) {
    }
#endif
  }
  DeviceDescriptor* d = &h.ring[ticket & (h.slots - 1)];
  d->op = static_cast<uint32_t>(DeviceOpKind::kDirect);
  d->flags = 0;
  d->addr = reinterpret_cast<uint64_t>(src);
  d->length = length;
  d->tag = 0;
  d->remote_size = 0;
  d->offset = 0;
  d->notify_value = value;
  store_release(&d->seq, ticket + 1);  // the fields before it (release at system scope)
  return static_cast<int64_t>(ticket);
}

DMX_HD inline int64_t signal_direct(const DeviceHandle& h, uint64_t* word, uint64_t value, const void* src,
                                    uint64_t length) {
  store_release(word, value);
  return post_direct(h, src, length, value);
}

// Waits until the signal word `word` (this GPU's memory, which a peer's kernel stores into) is at
// least `at_least`. 0; -kDeviceTimeout at the handle's deadline; the error word's -code once set
// (looked at every 64 polls: it is host memory, a round trip across PCIe). *seen (optional): the
// value read last.
DMX_HD inline int wait_signal(const DeviceHandle& h, const uint64_t* word, uint64_t at_least, uint64_t* seen) {
  if (h.control == nullptr || word == nullptr) return -kDeviceInvalid;
  const uint64_t deadline = deadline_of(h);
  for (uint32_t polls = 1;; ++polls) {
    uint64_t v = load_acquire(const_cast<uint64_t*>(word));
    if (seen != nullptr) *seen = v;
    if (v >= at_least) return kDeviceOk;
    if ((polls & 63) == 0) {
      if (int e = error(h)) return -e;
      if (now_ns() > deadline) return -kDeviceTimeout;
    }
  }
}

}  // namespace device_ring
}  // namespace dmx
