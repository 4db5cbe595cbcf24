// dmx bench --blocks: a KV cache's transfer — N scattered blocks of a paged cache into another —
// as one contiguous write (the bound), one write per block (before vectored writes), and one
// vectored write, side by side in one run (bench.h, run_blocks). Every run's bytes are checked
// where they arrived (outside the timed part): fresh random data each run, a mismatch fails it.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <numeric>
#include <random>

#include "tools/dmx/bench.h"

namespace dmx::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kControlTimeout = std::chrono::seconds(120);
constexpr auto kDataTimeout = std::chrono::seconds(300);

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// This thread's CPU time: posting measured without the other threads of a busy machine.
double thread_cpu() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Way {
  const char* name;
  double post_s = 1e30, done_s = 1e30;  // best of the runs: posting, first post -> landed
  double post_cpu_s = 1e30;             // posting, this thread's CPU time (best of the runs)
};

// Waits for the server's echo of the notification with `value` (a write's last byte landed).
Status await_note(Endpoint& ep, uint64_t value) {
  uint64_t got = 0;
  for (;;) {
    Request r = ep.recv(MemRegion{&got, sizeof got, {}}, kPongTag, with_timeout(kDataTimeout));
    DMX_RETURN_IF_ERROR(r.wait());
    if (got == value) return Status();
  }
}

// Fresh random bytes in host memory `h`, copied into `r` (of any kind) when it is not `h` itself.
Status fill_fresh(const MemRegion& h, const MemRegion& r, std::mt19937_64& rng) {
  auto* p = static_cast<unsigned char*>(h.ptr);
  uint64_t x = rng() | 1;
  size_t i = 0;
  for (; i + 8 <= h.size; i += 8) {  // xorshift64*: fast enough for GiBs between runs
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    uint64_t v = x * 0x2545F4914F6CDD1DULL;
    std::memcpy(p + i, &v, 8);
  }
  for (; i < h.size; ++i) p[i] = static_cast<unsigned char>(rng());
  if (r.ptr == h.ptr) return Status();
  return copy_memory(r, h);
}

// Block `i` of `got` (at got_ids[i]) must equal block i of `want` (at want_ids[i]); `n` blocks,
// or one range of n x size when the ids are null (the contiguous way).
Status compare_blocks(const char* way, const unsigned char* want, const std::vector<uint64_t>* want_ids,
                      const unsigned char* got, const std::vector<uint64_t>* got_ids, uint64_t n, uint64_t size) {
  if (want_ids == nullptr) {
    if (std::memcmp(want, got, n * size) == 0) return Status();
    for (uint64_t i = 0; i < n; ++i)
      if (std::memcmp(want + i * size, got + i * size, size) != 0)
        return Status(Code::kDataLoss, fmt::format("blocks: the {} way's bytes differ in block {}", way, i));
  }
  for (uint64_t i = 0; i < n; ++i)
    if (std::memcmp(want + (*want_ids)[i] * size, got + (*got_ids)[i] * size, size) != 0)
      return Status(Code::kDataLoss, fmt::format("blocks: the {} way's block {} (id {} -> id {}) arrived wrong", way,
                                                 i, (*want_ids)[i], (*got_ids)[i]));
  return Status();
}

}  // namespace

Status run_blocks(Endpoint& ep, const ClientOptions& o, uint64_t blocks, uint64_t block_size, uint32_t reps,
                  bool json) {
  if (blocks == 0 || block_size == 0) return Status(Code::kInvalidArgument, "--blocks and --block-size must be > 0");
  const bool write = o.op != "read";
  if (o.op == "send") return Status(Code::kInvalidArgument, "--blocks runs with --op write or read");
  // Each cache holds a quarter more blocks than move, so the block ids are scattered both sides.
  const uint64_t capacity = blocks + blocks / 4;
  const uint64_t bytes = capacity * block_size;
  Plan p;
  p.op = write ? "write" : "read";
  p.size = bytes;
  p.window = 1;
  p.warmup = 0;
  p.peer_mem = to_string(o.peer_mem);
  p.blocks = blocks;
  DMX_RETURN_IF_ERROR(send_text(ep, kPlanTag, to_json(p), kControlTimeout));
  DMX_ASSIGN_OR_RETURN(std::string rtext, recv_text(ep, kReplyTag, kControlTimeout));
  DMX_ASSIGN_OR_RETURN(Reply reply, reply_from_json(rtext));
  if (!reply.ok) return Status(Code::kPeerFailed, "bench server: " + reply.error);
  DMX_ASSIGN_OR_RETURN(Buffer local, Buffer::allocate(o.mem, bytes));
  // For the checks: the host image of the local cache (the source written, or what was read), and
  // of the server's (read back after a write; its data, once, for a read).
  const bool host_local = o.mem.kind == MemKind::kHost || o.mem.kind == MemKind::kPinned;
  Buffer local_img, peer_img, peer_copy;
  DMX_ASSIGN_OR_RETURN(peer_copy, Buffer::allocate(o.mem, bytes));
  if (!host_local) {
    DMX_ASSIGN_OR_RETURN(local_img, Buffer::allocate(MemSpec{}, bytes));
    DMX_ASSIGN_OR_RETURN(peer_img, Buffer::allocate(MemSpec{}, bytes));
  }
  const MemRegion local_h = host_local ? local.region() : local_img.region();
  const MemRegion peer_h = host_local ? peer_copy.region() : peer_img.region();
  auto fetch_peer = [&]() -> Status {  // the server's whole cache into peer_h
    DMX_RETURN_IF_ERROR(ep.read(peer_copy.region(), reply.region, 0, with_timeout(kDataTimeout)).wait());
    return host_local ? Status() : copy_memory(peer_h, peer_copy.region());
  };

  std::mt19937_64 rng{std::random_device{}()};
  auto ids = [&] {
    std::vector<uint64_t> v(capacity);
    std::iota(v.begin(), v.end(), 0);
    std::shuffle(v.begin(), v.end(), rng);
    v.resize(blocks);
    return v;
  };
  std::vector<uint64_t> mine = ids(), theirs = ids();
  if (!write) DMX_RETURN_IF_ERROR(fetch_peer());
  // Before each way: fresh data where it starts (write) or where it lands (read), so that bytes a
  // way failed to move cannot pass for an earlier way's.
  auto fresh = [&]() { return fill_fresh(local_h, local.region(), rng); };
  auto check = [&](const char* way, bool blocked) -> Status {
    const auto* l = static_cast<const unsigned char*>(local_h.ptr);
    const auto* r = static_cast<const unsigned char*>(peer_h.ptr);
    if (write) {
      DMX_RETURN_IF_ERROR(fetch_peer());
      return compare_blocks(way, l, blocked ? &mine : nullptr, r, blocked ? &theirs : nullptr, blocks, block_size);
    }
    if (!host_local) DMX_RETURN_IF_ERROR(copy_memory(local_h, local.region()));
    return compare_blocks(way, r, blocked ? &theirs : nullptr, l, blocked ? &mine : nullptr, blocks, block_size);
  };
  std::vector<IoEntry> entries(blocks);
  for (uint64_t i = 0; i < blocks; ++i)
    entries[i] = IoEntry{0, 0, mine[i] * block_size, theirs[i] * block_size, block_size};
  MemRegion regions[] = {local.region()};
  RemoteRegion remote[] = {reply.region};
  uint64_t note = 1;
  OpOptions data = with_timeout(kDataTimeout);
  OpOptions notify = data;
  notify.notify = write;

  Way contiguous{"contiguous"}, per_block{"per-block"}, vectored{"vectored"};
  for (uint32_t rep = 0; rep < reps + 1; ++rep) {  // the first run is an untimed warm-up
    bool timed = rep > 0;
    // One contiguous transfer of the same total.
    notify.notify_value = note;
    DMX_RETURN_IF_ERROR(fresh());
    auto t0 = Clock::now();
    Request r = write ? ep.write(local.region().sub(0, blocks * block_size), reply.region, 0, notify)
                      : ep.read(local.region().sub(0, blocks * block_size), reply.region, 0, data);
    double post = seconds_since(t0);
    DMX_RETURN_IF_ERROR(r.wait());
    if (write) DMX_RETURN_IF_ERROR(await_note(ep, note++));
    if (timed) {
      contiguous.post_s = std::min(contiguous.post_s, post);
      contiguous.done_s = std::min(contiguous.done_s, seconds_since(t0));
    }
    DMX_RETURN_IF_ERROR(check("contiguous", false));
    // One operation per block, kWindow in flight (a peer takes at most max_inflight_ops, 4,096 by
    // default); the last notifies. Its post time is that of the first kWindow.
    constexpr uint64_t kWindow = 1024;
    std::vector<Request> reqs(std::min(blocks, kWindow));
    DMX_RETURN_IF_ERROR(fresh());
    t0 = Clock::now();
    post = 0;
    for (uint64_t i = 0; i < blocks; ++i) {
      Request& slot = reqs[i % reqs.size()];
      if (slot.valid()) DMX_RETURN_IF_ERROR(slot.wait());
      if (i == reqs.size()) post = seconds_since(t0);
      MemRegion block = local.region().sub(mine[i] * block_size, block_size);
      OpOptions one = data;
      if (write && i + 1 == blocks) {
        one = notify;
        one.notify_value = note;
      }
      slot = write ? ep.write(block, reply.region, theirs[i] * block_size, one)
                   : ep.read(block, reply.region, theirs[i] * block_size, one);
    }
    if (post == 0) post = seconds_since(t0);
    for (auto& q : reqs) DMX_RETURN_IF_ERROR(q.wait());
    if (write) DMX_RETURN_IF_ERROR(await_note(ep, note++));
    if (timed) {
      per_block.post_s = std::min(per_block.post_s, post);
      per_block.done_s = std::min(per_block.done_s, seconds_since(t0));
    }
    DMX_RETURN_IF_ERROR(check("per-block", true));
    // One vectored operation.
    notify.notify_value = note;
    DMX_RETURN_IF_ERROR(fresh());
    double cpu0 = thread_cpu();
    t0 = Clock::now();
    r = write ? ep.write_vec(regions, remote, entries, notify) : ep.read_vec(regions, remote, entries, data);
    post = seconds_since(t0);
    if (timed) vectored.post_cpu_s = std::min(vectored.post_cpu_s, thread_cpu() - cpu0);
    DMX_RETURN_IF_ERROR(r.wait());
    if (write) DMX_RETURN_IF_ERROR(await_note(ep, note++));
    if (timed) {
      vectored.post_s = std::min(vectored.post_s, post);
      vectored.done_s = std::min(vectored.done_s, seconds_since(t0));
    }
    DMX_RETURN_IF_ERROR(check("vectored", true));
  }
  Status done = send_text(ep, kDoneTag, "done", kControlTimeout);
  if (done.ok()) {
    auto last = recv_text(ep, kReplyTag, kControlTimeout);
    done = last.status();
  }
  const double total = static_cast<double>(blocks * block_size);
  const char* until = write ? "notification" : "completion";
  if (!json) {
    fmt::print("# blocks: {} x {} B ({} MiB) {} {} -> {}, transport {}, best of {}\n", blocks, block_size,
               blocks * block_size >> 20, p.op, to_string(o.mem), to_string(o.peer_mem), reply.transport, reps);
    fmt::print("# {:<11} {:>12} {:>9} {:>12} {:>14} {:>12}\n", "way", "blocks/s", "GB/s", "post_ms", "to_" + std::string(until) + "_ms",
               "vs_contig");
  }
  if (!json) fmt::print("# every run's bytes checked where they arrived: all matched\n");
  if (!json)
    fmt::print(
        "# vectored post: {:.3f} ms of the posting thread's CPU ({} entries; list_threads helpers not counted)\n",
        vectored.post_cpu_s * 1e3, blocks);
  for (const Way* w : {&contiguous, &per_block, &vectored}) {
    double rate = total / w->done_s / 1e9;
    double ratio = contiguous.done_s / w->done_s;
    if (json) {
      fmt::print("{{\"op\":\"{}\",\"way\":\"{}\",\"blocks\":{},\"block_size\":{},\"blocks_per_s\":{:.0f},\"gb_per_s\":{:.3f},"
                 "\"post_ms\":{:.3f},\"post_cpu_ms\":{:.3f},\"done_ms\":{:.3f},\"vs_contiguous\":{:.3f},\"transport\":\"{}\"}}\n",
                 p.op, w->name, blocks, block_size, static_cast<double>(blocks) / w->done_s, rate, w->post_s * 1e3,
                 w == &vectored ? w->post_cpu_s * 1e3 : 0.0, w->done_s * 1e3, ratio, reply.transport);
    } else {
      fmt::print("  {:<11} {:>12.0f} {:>9.3f} {:>12.3f} {:>14.3f} {:>12.3f}\n", w->name,
                 static_cast<double>(blocks) / w->done_s, rate, w->post_s * 1e3, w->done_s * 1e3, ratio);
    }
  }
  return done;
}

}  // namespace dmx::bench
