// Kernels of the device API's GPU tests and bench (device_kernels.cu), behind host functions with
// no CUDA types. Each launches one block on the current device's default stream and waits for it
// (cudaDeviceSynchronize); the return is the launch or execution error, empty when ok.
#pragma once

#include <cstdint>
#include <string>

#include "dmx/device_handle.h"

namespace dmx::test {

// Byte i of round r of a run: both sides compute it on the GPU from the run's seed.
inline unsigned char pattern_byte(uint64_t seed, uint64_t round, uint64_t i) {
  uint64_t x = seed ^ (round * 0x9e3779b97f4a7c15ull) ^ (i * 0xbf58476d1ce4e5b9ull);
  x ^= x >> 31;
  x *= 0x94d049bb133111ebull;
  return static_cast<unsigned char>(x >> 56);
}

// Writer: for each round r, fills src (device, `len` bytes) with pattern(seed, r), writes it to
// dst at r * len with a notification (value r + 1) and waits for it to land. *result (device int):
// 0, or the first failing call's -code.
std::string run_put_rounds(const DeviceHandle& h, unsigned char* src, uint64_t len, DeviceRemote dst, int rounds,
                           uint64_t seed, int* result);

// Reader: for each round r, waits for r + 1 notifications, then checks [r * len, +len) of `region`
// (device) holds pattern(seed, r). *result: 0; -code of a failed wait; 1000 + r for stale bytes.
std::string run_check_rounds(const DeviceHandle& h, const unsigned char* region, uint64_t len, int rounds,
                             uint64_t seed, int* result);

// Writes (8 B, notify) until a call fails; *result gets the -code, *elapsed_ns how long that took
// from the first failing call's start (device memory, both).
std::string run_until_failure(const DeviceHandle& h, unsigned char* src, DeviceRemote dst, int* result,
                              uint64_t* elapsed_ns, uint64_t* rounds_done);

// Kernel clock bench: `iters` rounds of an 8-byte write + notification; `pong` false: time from
// post to its landed completion; true: ping-pong, the peer's kernel answers each (run_pong).
// times_ns (device, iters entries) gets each round's time.
std::string run_ping(const DeviceHandle& h, unsigned char* src, DeviceRemote dst, int iters, bool pong,
                     uint64_t* times_ns, int* result);
// The peer's side: waits for notification i + 1, answers with an 8-byte write + notification.
std::string run_pong(const DeviceHandle& h, unsigned char* src, DeviceRemote dst, int iters, int* result);

// Direct puts (cuda_ipc windows). Writer: for each round r, fills src with pattern(seed, r) and
// stores it into `data` at r * len with block_put_signal, signal word at offset 0 of `signal`
// = r + 1. Reader: waits for its signal word (device memory) >= r + 1, then checks the round's
// bytes of `region`. *result as run_put_rounds / run_check_rounds.
std::string run_direct_put_rounds(const DeviceHandle& h, unsigned char* src, uint64_t len, DeviceWindow data,
                                  DeviceWindow signal, int rounds, uint64_t seed, int* result);
std::string run_direct_check_rounds(const DeviceHandle& h, const unsigned char* region, uint64_t len,
                                    const uint64_t* signal, int rounds, uint64_t seed, int* result);

// Kernel clock bench of direct puts, 8 bytes into `dst` + signal (offset 0 of `signal`), value i + 1.
// pong false: one-sided; steps_ns (device, 3 * iters) gets per round the time to store and fence
// the bytes, to store and fence the signal, and to tell the host (kDirect). pong true: ping-pong,
// the peer's kernel (run_direct_pong) waits for each signal in its own word and answers;
// steps_ns[3i] gets the round trip. `mine`: this side's signal word (device memory).
std::string run_direct_ping(const DeviceHandle& h, unsigned char* src, DeviceWindow dst, DeviceWindow signal,
                            const uint64_t* mine, int iters, bool pong, uint64_t* steps_ns, int* result);
std::string run_direct_pong(const DeviceHandle& h, unsigned char* src, DeviceWindow dst, DeviceWindow signal,
                            const uint64_t* mine, int iters, int* result);

// A one-block kernel that spins on the current device, on a stream of its own, until stop_spinner()
// or `max_ns` (the kernel's clock) have passed; start_spinner returns once it runs. stop_spinner
// waits for it; *stopped: true when it ended because it was told, false when its time ran out.
std::string start_spinner(uint64_t max_ns);
std::string stop_spinner(bool* stopped);

// Device memory helpers (cudaSetDevice, cudaMalloc / cudaMemcpy / cudaFree), for the tests' results.
std::string set_device(int device);
void* device_alloc(uint64_t bytes);
void device_free(void* p);
std::string copy_to_host(void* host, const void* dev, uint64_t bytes);
std::string copy_to_device(void* dev, const void* host, uint64_t bytes);

}  // namespace dmx::test
