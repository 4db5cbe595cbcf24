// dmx/device.cuh — kernels that send (CUDA only; docs/gpu-push.md).
//
// From inside a kernel, a thread block posts a send or a one-sided write of a region of its GPU's
// memory on an endpoint, waits for it to complete, and waits for notifications the peer's writes
// delivered; the endpoint's host thread does the rest (dmx/device_handle.h has the protocol).
// Get the handle on the host with Endpoint::device_handle() and pass it to the kernel by value.
//
// Block calls (dmx::device::block_*) must be reached by every thread of the block (they contain
// __syncthreads); thread 0 does the work and the result is broadcast. The thread-level calls
// (post_send, post_write, wait, wait_notifications) are for one thread that has arranged the
// fences itself.
//
// Memory-ordering contract:
//  * Before posting, every byte of the source must have been stored and fenced at system scope
//    by the thread that stored it (`__threadfence_system()`), and those threads must have passed a
//    barrier with the posting thread. block_send/block_write do both for the calling block;
//    bytes stored by other blocks or kernels are the caller's to order (a grid sync or an
//    earlier kernel).
//  * Until wait() for its ticket returns 0 the source must not change (the host may copy it at
//    any time in between). After it returns 0 the source may be reused; for a write, the bytes
//    have landed at the target.
//  * After wait_notifications() returns 0 for count n, the bytes of the first n notifying
//    writes into this GPU's memory are visible to the block (block_wait_notifications fences
//    with acquire semantics at system scope in every thread after the barrier). Values the
//    block loaded from that memory before the wait are stale: load them again.
//  * Every call returns within the handle's timeout_ns (default 1 s), -kDeviceTimeout
//    otherwise; a dead peer or a closed endpoint returns its code (e.g. -kPeerFailed) at once.
#pragma once

#include "dmx/device_handle.h"

namespace dmx::device {

// Thread-level calls (see the contract above).
__device__ inline int64_t post_send(const DeviceHandle& h, const void* src, uint64_t length, uint64_t tag) {
  return device_ring::post(h, DeviceOpKind::kSend, 0, src, length, tag, 0, 0, 0);
}
__device__ inline int64_t post_write(const DeviceHandle& h, const void* src, uint64_t length, DeviceRemote dst,
                                     uint64_t offset, bool notify = false, uint64_t notify_value = 0) {
  return device_ring::post(h, DeviceOpKind::kWrite, notify ? kDeviceNotify : 0u, src, length, dst.key, dst.size,
                           offset, notify_value);
}
__device__ inline int wait(const DeviceHandle& h, uint64_t ticket) { return device_ring::wait(h, ticket); }
__device__ inline int wait_notifications(const DeviceHandle& h, uint64_t count, uint64_t* value = nullptr) {
  return device_ring::wait_notifications(h, count, value);
}
__device__ inline int error(const DeviceHandle& h) { return device_ring::error(h); }

namespace detail {
// Every thread fences its own stores, the block meets, thread 0 posts; the ticket is broadcast.
template <class Post>
__device__ inline int64_t block_post(Post post) {
  __shared__ long long ticket;
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) ticket = post();
  __syncthreads();
  int64_t t = ticket;
  __syncthreads();  // nobody overwrites `ticket` in a next call before all have read it
  return t;
}
template <class Wait>
__device__ inline int block_wait(Wait wait) {
  __shared__ int result;
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) result = wait();
  __syncthreads();
  int r = result;
  device_ring::fence_acquire_system();
  __syncthreads();
  return r;
}
}  // namespace detail

// Block calls: every thread of the block calls them with the same arguments.
__device__ inline int64_t block_send(const DeviceHandle& h, const void* src, uint64_t length, uint64_t tag) {
  return detail::block_post([&] { return post_send(h, src, length, tag); });
}
__device__ inline int64_t block_write(const DeviceHandle& h, const void* src, uint64_t length, DeviceRemote dst,
                                      uint64_t offset, bool notify = false, uint64_t notify_value = 0) {
  return detail::block_post([&] { return post_write(h, src, length, dst, offset, notify, notify_value); });
}
__device__ inline int block_wait(const DeviceHandle& h, int64_t ticket) {
  if (ticket < 0) return static_cast<int>(ticket);
  return detail::block_wait([&] { return wait(h, static_cast<uint64_t>(ticket)); });
}
__device__ inline int block_wait_notifications(const DeviceHandle& h, uint64_t count) {
  return detail::block_wait([&] { return wait_notifications(h, count, nullptr); });
}

// --- Direct puts into a peer's mapped memory (cuda_ipc; Endpoint::import_device_window). ---
//
// block_put_signal: the block stores `length` bytes from `src` (this GPU's memory) into window `dst`
// at `offset` itself (posted stores over NVLink / PCIe P2P: no copy engine, no host), every thread
// fences at system scope, the block meets, and thread 0 stores `value` into the 8-byte signal word
// at `signal_offset` of window `signal` with a release store at system scope. A peer kernel that
// acquires the signal (block_wait_signal) then sees the bytes. Afterwards thread 0 tells the host
// (a kDirect descriptor: counted in EndpointStats::device_direct_*). Returns 0, or -code:
// -kDeviceInvalid when a range is outside its window or the signal word is unaligned (nothing
// stored), or the error word's code, read when telling the host, after the bytes and the signal
// went out (a dead peer: they land in memory this endpoint's mapping keeps, which nobody reads). Signal values should grow (a round counter): waiters wait for
// "at least". `src` may be reused as soon as the call returns.
__device__ inline int block_put_signal(const DeviceHandle& h, const void* src, uint64_t length, DeviceWindow dst,
                                       uint64_t offset, DeviceWindow signal, uint64_t signal_offset, uint64_t value) {
  __shared__ int result;
  uint64_t* word = device_ring::signal_word(signal, signal_offset);
  if (!device_ring::window_holds(dst, offset, length) || word == nullptr || h.control == nullptr)
    return -kDeviceInvalid;  // the same answer in every thread: the arguments are the block's
  // No look at the error word first: it is host memory, a PCIe round trip (~1 us) on the path.
  const bool leader = threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
  const unsigned nthreads = blockDim.x * blockDim.y * blockDim.z;
  const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  auto* d = reinterpret_cast<unsigned char*>(dst.base + offset);
  const auto* s = static_cast<const unsigned char*>(src);
  uint64_t done = 0;
  if (((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s)) & 15) == 0) {
    const uint64_t vecs = length / 16;
    for (uint64_t i = tid; i < vecs; i += nthreads)
      reinterpret_cast<uint4*>(d)[i] = reinterpret_cast<const uint4*>(s)[i];
    done = vecs * 16;
  } else if (((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s)) & 7) == 0) {
    const uint64_t words = length / 8;
    for (uint64_t i = tid; i < words; i += nthreads)
      reinterpret_cast<uint64_t*>(d)[i] = reinterpret_cast<const uint64_t*>(s)[i];
    done = words * 8;
  }
  for (uint64_t i = done + tid; i < length; i += nthreads) d[i] = s[i];
  __threadfence_system();
  __syncthreads();
  if (leader) {
    int64_t t = device_ring::signal_direct(h, word, value, src, length);
    result = t < 0 ? static_cast<int>(t) : 0;
  }
  __syncthreads();
  const int r = result;
  __syncthreads();  // nobody overwrites `result` in a next call before all have read it
  return r;
}

// Waits until this GPU's signal word `word` (inside a window this side exported) is at least
// `at_least`; then the bytes of every put that signalled up to that value are visible to the
// block (thread 0 acquires, the block meets, every thread fences with acquire semantics at system
// scope). 0, -kDeviceTimeout at the handle's deadline, or the error word's code.
__device__ inline int block_wait_signal(const DeviceHandle& h, const uint64_t* word, uint64_t at_least) {
  return detail::block_wait([&] { return device_ring::wait_signal(h, word, at_least, nullptr); });
}

}  // namespace dmx::device
