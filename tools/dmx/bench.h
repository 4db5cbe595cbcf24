// dmx bench: measurement sessions between a client (which decides the run) and a server.
//
// For each plan the client sends (JSON, tag kPlanTag), the server allocates its memory, answers
// with a Reply, and then both run the plan's warm-up and:
//  1. throughput: `iters` operations with `window` in flight (send/recv, write or read);
//  2. latency: sequential round trips (send: ping-pong, reported as half the round trip;
//     write/read: the operation's completion time);
//  3. verify (--verify): every buffer that received data is checksummed and compared with the
//     checksum of the fresh random source.
// The client runs two plans per size: throughput only (lat_iters 0), then latency only (iters 0),
// so that the latency sample count can follow the time per operation just measured.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "dmx/dmx.h"

namespace dmx::bench {

inline constexpr uint64_t kPlanTag = 0xB0000001;
inline constexpr uint64_t kReplyTag = 0xB0000002;
inline constexpr uint64_t kDoneTag = 0xB0000003;
inline constexpr uint64_t kDataTag = 0xB0000010;
inline constexpr uint64_t kPingTag = 0xB0000011;
inline constexpr uint64_t kPongTag = 0xB0000012;
inline constexpr size_t kControlMax = 4096;
// The most memory one plan makes the server allocate (window x size): a plan asking more is refused.
inline constexpr uint64_t kMaxServerBuffer = uint64_t{64} << 30;

inline OpOptions with_timeout(Duration t) {
  OpOptions o;
  o.timeout = t;
  return o;
}

struct Plan {
  std::string op = "send";  // send | write | read
  uint64_t size = 0;
  uint32_t iters = 0, window = 1, lat_iters = 0;
  // Untimed operations first: the first use of a buffer pays one-time costs (a CUDA IPC handle
  // exported and mapped, ...) that are not transfer time.
  uint32_t warmup = 1;
  std::string peer_mem = "host";
  bool verify = false;
  uint64_t checksum = 0;  // send/write: the source's
  uint32_t crc = 0;       // with --checksum crc32c, send/write: the source's CRC32C
  bool quit = false;      // the client is done with this endpoint
  // --blocks: a block run (run_blocks); the server answers each notification of a write with an
  // 8-byte kPongTag message carrying its value, so the client sees when the last byte landed.
  uint64_t blocks = 0;
};

struct Reply {
  bool ok = true;
  std::string error;
  RemoteRegion region;     // write/read: the server's registered memory (window slots of size)
  uint64_t checksum = 0;   // read: the server's data
  bool verified = false;   // after the run: every slot matched
  uint32_t crc = 0;        // read: the CRC32C of the server's data
  // After the run, with checksums: every operation of the server reported the plan's CRC32C.
  bool crc_ok = true;
  std::string transport, reason;
  // After the run: the chunks the server's payload paths received so far (all sizes of the
  // session), and how many of them its small-chunk lane moved — the receive side of the
  // throughput phase of a send, which the client cannot see in its own statistics.
  uint64_t path_chunks_received = 0, path_chunks_inline = 0;
};

std::string to_json(const Plan& p);
Result<Plan> plan_from_json(const std::string& s);
std::string to_json(const Reply& r);
Result<Reply> reply_from_json(const std::string& s);

// A fast 64-bit checksum of host memory (4 independent lanes, then mixed).
uint64_t checksum(const unsigned char* p, size_t n);
// Checksum of memory of any kind (copied to the host first when it is device memory).
Result<uint64_t> checksum_region(const MemRegion& r);
// The CRC32C of memory of any kind (copied to the host first when it is device memory).
Result<uint32_t> crc32c_region(const MemRegion& r);
// Fills a region of any kind with fresh random bytes; returns their checksum.
Result<uint64_t> fill_random(const MemRegion& r);

// Small JSON control messages over the endpoint.
Status send_text(Endpoint& ep, uint64_t tag, const std::string& text, Duration timeout);
Result<std::string> recv_text(Endpoint& ep, uint64_t tag, Duration timeout);

// Serves bench sessions on one endpoint until the client quits or the endpoint ends (another
// thread may close it to end the session). `ctx` is the endpoint's context: memory registered
// there is what the endpoint's peer can reach, and a plan's buffer is charged to its
// peer_memory_budget (a plan over it is refused with the reason). A client that sends no plan, or
// moves no data during one, for `idle` loses the session (closed; the buffer freed).
inline constexpr std::chrono::seconds kDefaultIdle{60};
Status serve(Context ctx, Endpoint& ep, Duration idle = kDefaultIdle);

struct Result1 {  // one size
  Plan plan;             // the throughput phase's
  uint32_t lat_samples = 0;
  double seconds = 0;    // the throughput phase's wall time
  double gb_per_s = 0, msg_per_s = 0, p50_us = 0, p99_us = 0, p999_us = 0, cpu_pct = 0;
  bool verified = false;
  // --checksum crc32c: every operation on both sides reported the CRC32C of the bytes it moved
  // (the endpoint's per-chunk checksums, folded), equal to the source's.
  bool checksum_ok = false;
  uint64_t peer_path_chunks_received = 0, peer_path_chunks_inline = 0;  // the server's (Reply)
  std::vector<uint64_t> stream_bytes_sent;  // this side's, per stream, in the throughput phase
  std::string error;
};

struct ClientOptions {
  std::string op = "send";
  MemSpec mem, peer_mem;
  uint64_t cumem_block = 0;  // this side's CUDA buffers: 0 cudaMalloc, else cuMem blocks of this size
  std::vector<uint64_t> sizes;
  uint32_t iters = 0;  // 0: chosen per size (both phases)
  uint32_t window = 0;  // operations in flight in the throughput phase; 0: by size (auto_window)
  bool verify = false;
  bool checksum = false;  // the endpoint checksums every chunk (--checksum crc32c): check each op's CRC
  int64_t streams_asked = 0;  // the streams setting, for the header to say why the endpoint has fewer
  // Where run_size is, for a progress line another thread prints: "throughput" or "latency".
  std::atomic<const char*>* phase = nullptr;
};

// How many operations the throughput phase times (the latency phase: latency_samples).
inline constexpr uint32_t kMinSamples = 1000;   // perftest's default; p999 needs 1,000
inline constexpr double kLatencyBudgetSeconds = 2;
inline constexpr uint32_t kMinLargeSamples = 10;
// Throughput: operations moving about 4 GiB, at most 2,000 (all sizes up to 2 MiB), at least 8.
uint32_t throughput_iters(uint64_t size);
// Latency: kMinSamples round trips, or as many as fit in kLatencyBudgetSeconds at `op_seconds`
// (the throughput phase's time per operation) when 1,000 would take longer, at least 10.
uint32_t latency_samples(double op_seconds);

// Sizes from MIN to MAX multiplying by FACTOR (nccl-tests -b/-e/-f); errors name the option.
Result<std::vector<uint64_t>> size_range(uint64_t min, uint64_t max, uint64_t factor);
// "8,4K,1M": sizes parsed with parse_size.
Result<std::vector<uint64_t>> parse_size_list(const std::string& list);

// Runs one size against a server; fills everything but cpu_pct.
Result<Result1> run_size(Endpoint& ep, const ClientOptions& o, uint64_t size);
Status quit(Endpoint& ep);

// --blocks N --block-size S: N blocks of S bytes at random block ids of a paged cache written into
// (or read from) random block ids of the server's cache, three ways in one run: one contiguous
// write of N x S bytes (the bound), N writes (one per block, as before vectored writes), and one
// vectored write of N entries. Reports blocks/s, GB/s, the time to post and from the first post
// to the notification (write; read: to the completion). `reps` runs of each, the best reported.
// Every run starts from fresh random data and its bytes are compared where they arrived (the
// server's cache read back after a write): a mismatch fails the run with kDataLoss.
Status run_blocks(Endpoint& ep, const ClientOptions& o, uint64_t blocks, uint64_t block_size, uint32_t reps,
                  bool json);

}  // namespace dmx::bench
