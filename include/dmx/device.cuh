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

}  // namespace dmx::device
