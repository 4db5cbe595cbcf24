// shm_bench: host->host bandwidth between two processes over the shm link, next to single-thread
// memcpy bandwidth measured in the same run (rounds alternated), and the 8-byte half round trip.
// One JSON line per measurement.
//
//   shm_bench [--min-size BYTES] [--max-size BYTES] [--slot-size BYTES] [--slots N] [--seconds S]
//             [--rounds N]
// Sizes: --min-size (4 KiB), then x16 up to --max-size. The ring defaults to the engine's
// (shm_slot_size x shm_slots). Per size, --rounds (3) rounds of: memcpy into a warm destination,
// memcpy into a fresh (never touched) destination, and the shm transfer; the best of each, with
// where each side's time went during the best shm round (copying in progress(), waiting, page
// faults, doorbells sent). Source and destination are the engine's host memory, as in dmx bench.
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/config.h"
#include "dmx/memory.h"
#include "transport/shm/shm.h"

using namespace dmx;
using shm::Completion;

namespace {

double now_s() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// Where one side's time goes while it waits for completions.
struct SideTimes {
  double progress_s = 0, wait_s = 0;
};
SideTimes g_times;

long minor_faults() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

// Progress until (kind, id) completes; exits the process on failure (a benchmark, not a library).
void finish(shm::ShmLink& link, Completion::Kind kind, shm::MsgId id) {
  static std::map<std::pair<int, shm::MsgId>, Status> seen;
  static std::vector<Completion> out;
  for (;;) {
    auto it = seen.find({kind, id});
    if (it != seen.end()) {
      if (!it->second.ok()) {
        fmt::print(stderr, "shm_bench: {}\n", it->second.to_string());
        ::_exit(1);
      }
      seen.erase(it);
      return;
    }
    out.clear();
    double t0 = now_s();
    size_t n = link.progress(&out);
    double t1 = now_s();
    g_times.progress_s += t1 - t0;
    if (n == 0) {
      Status s = link.wait(Deadline::after(std::chrono::seconds(30)));
      g_times.wait_s += now_s() - t1;
      if (!s.ok()) {
        fmt::print(stderr, "shm_bench: {}\n", s.to_string());
        ::_exit(1);
      }
    }
    for (auto& c : out) seen.emplace(std::make_pair(int(c.kind), c.id), std::move(c.status));
  }
}

// Single-thread memcpy from `src` into a warm destination (the reference), for about `seconds`.
double memcpy_gbps(const char* src, size_t size, double seconds) {
  static std::vector<char> b;
  if (b.size() < size) b.assign(size, 2);
  std::memcpy(b.data(), src, size);  // warm
  size_t iters = 0;
  double t0 = now_s(), t1 = t0;
  do {
    std::memcpy(b.data(), src, size);
    asm volatile("" : : "r"(b.data()) : "memory");
    ++iters;
    t1 = now_s();
  } while (t1 - t0 < seconds);
  return double(size) * double(iters) / (t1 - t0) / 1e9;
}

// The same into a fresh mapping (every page faulted in by the copy): what a receiver sees when
// its buffer is new.
double memcpy_cold_gbps(const char* src, size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 0;
  double t0 = now_s();
  std::memcpy(p, src, size);
  asm volatile("" : : "r"(p) : "memory");
  double dt = now_s() - t0;
  ::munmap(p, size);
  return double(size) / dt / 1e9;
}

// What the receiving child reports with its ack of a round.
struct Ack {
  uint64_t ctl;
  double progress_s, wait_s;
  uint64_t faults, wakeups, copies;
};

// Source and destination as dmx bench has them: the engine's host memory (Buffer::allocate: large
// buffers on transparent huge pages), written once. Kept for the life of the process.
char* host_buffer(size_t n, int fill) {
  static std::vector<Buffer> keep;
  auto b = Buffer::allocate(MemSpec{}, n);
  if (!b.ok()) {
    fmt::print(stderr, "shm_bench: {}\n", b.status().to_string());
    ::_exit(1);
  }
  std::memset(b->data(), fill, n);
  keep.push_back(std::move(*b));
  return static_cast<char*>(keep.back().data());
}

size_t arg_size(int argc, char** argv, const char* name, size_t def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == name) return std::stoull(argv[i + 1]);
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  size_t max_size = arg_size(argc, argv, "--max-size", 256u << 20);
  double seconds = double(arg_size(argc, argv, "--seconds", 1));
  int rounds = static_cast<int>(std::max<size_t>(1, arg_size(argc, argv, "--rounds", 3)));
  auto config = Config::resolve();  // the engine's ring (DMX_SHM_* included) unless told otherwise
  if (!config.ok()) return 1;
  auto engine = shm::link_options(*config);
  if (!engine.ok()) return 1;
  shm::LinkOptions options = *engine;
  options.slot_size = arg_size(argc, argv, "--slot-size", options.slot_size);
  options.slots = static_cast<uint32_t>(arg_size(argc, argv, "--slots", options.slots));
  std::vector<size_t> sizes;
  for (size_t s = arg_size(argc, argv, "--min-size", 4096); s <= max_size; s *= 16) sizes.push_back(s);
  if (sizes.back() != max_size) sizes.push_back(max_size);

  Status avail = shm::available();
  if (!avail.ok()) {
    fmt::print("{{\"bench\":\"shm\",\"skipped\":\"{}\"}}\n", avail.message());
    return 0;
  }
  auto pair = UnixChannel::pair();
  if (!pair.ok()) return 1;
  // Iteration counts are decided by the parent per size and sent as the first 8-byte message.
  pid_t child = ::fork();
  if (child == 0) {
    { UnixChannel drop = std::move(pair->first); }
    // Each process its own crew, made after the fork (threads do not survive it), as the engine's.
    auto link = shm::ShmLink::accept(std::move(pair->second), Deadline::after(std::chrono::seconds(10)),
                                     CopyCrew::make(options.copy_threads));
    if (!link.ok()) ::_exit(2);
    shm::ShmLink& l = **link;
    char* buf = host_buffer(max_size, 3);
    uint64_t ctl = 0, id = 0, sid = 0;  // id: parent->child messages; sid: child->parent
    for (;;) {
      (void)l.post_recv(++id, {&ctl, 8, {}});
      finish(l, Completion::kRecv, id);
      if (ctl == 0) ::_exit(0);
      if (ctl == ~0ull) {  // ping-pong: echo 8-byte messages until a zero
        for (;;) {
          (void)l.post_recv(++id, {&ctl, 8, {}});
          finish(l, Completion::kRecv, id);
          (void)l.post_send(++sid, {&ctl, 8, {}});
          finish(l, Completion::kSend, sid);
          if (ctl == 0) break;
        }
        continue;
      }
      uint64_t size = ctl >> 32, iters = ctl & 0xffffffff;
      g_times = {};
      long f0 = minor_faults();
      shm::LinkStats s0 = l.stats();
      for (uint64_t i = 0; i < iters; ++i) (void)l.post_recv(++id, {buf, size, {}});
      for (uint64_t k = id - iters + 1; k <= id; ++k) finish(l, Completion::kRecv, k);
      static Ack ack;
      ack = Ack{ctl,
                g_times.progress_s,
                g_times.wait_s,
                uint64_t(minor_faults() - f0),
                l.stats().wakeups_sent - s0.wakeups_sent,
                l.stats().host_copies - s0.host_copies};
      (void)l.post_send(++sid, {&ack, sizeof ack, {}});  // ack
      finish(l, Completion::kSend, sid);
    }
  }
  { UnixChannel drop = std::move(pair->second); }
  options.crew = CopyCrew::make(options.copy_threads);
  auto link = shm::ShmLink::create(std::move(pair->first), options, Deadline::after(std::chrono::seconds(10)));
  if (!link.ok()) {
    fmt::print(stderr, "shm_bench: {}\n", link.status().to_string());
    return 1;
  }
  shm::ShmLink& l = **link;
  char* src = host_buffer(max_size, 7);
  uint64_t ctl = 0, id = 0, rid = 0;
  Ack ack{};

  // One message of the largest size on the fresh link: its ring's pages are touched for the first
  // time (the region is mapped without MAP_POPULATE), the destination is warm.
  {
    ctl = (uint64_t(max_size) << 32) | 1;
    long f0 = minor_faults();
    double t0 = now_s();
    (void)l.post_send(++id, {&ctl, 8, {}});
    (void)l.post_recv(++rid, {&ack, sizeof ack, {}});
    (void)l.post_send(++id, {src, max_size, {}});
    finish(l, Completion::kRecv, rid);
    double dt = now_s() - t0;
    std::vector<Completion> rest;
    while (l.pending() != 0) l.progress(&rest);
    fmt::print(
        "{{\"bench\":\"shm.first_message\",\"size\":{},\"slot_size\":{},\"slots\":{},\"shm_GBps\":{:.2f},"
        "\"tx_faults\":{},\"rx_faults\":{}}}\n",
        max_size, options.slot_size, options.slots, double(max_size) / dt / 1e9, minor_faults() - f0, ack.faults);
  }

  for (size_t size : sizes) {
    uint64_t iters = std::max<uint64_t>(4, std::min<uint64_t>(100000, (4ull << 30) / size));
    double best = 0, ref = 0, cold = 0, tx_busy = 0, tx_wait = 0;
    long tx_faults = 0;
    uint64_t tx_wakeups = 0;
    Ack best_ack{};
    for (int round = 0; round < rounds; ++round) {
      ref = std::max(ref, memcpy_gbps(src, size, seconds / 2));
      cold = std::max(cold, memcpy_cold_gbps(src, size));
      ctl = (uint64_t(size) << 32) | iters;
      g_times = {};
      long f0 = minor_faults();
      uint64_t w0 = l.stats().wakeups_sent;
      double t0 = now_s();
      (void)l.post_send(++id, {&ctl, 8, {}});
      (void)l.post_recv(++rid, {&ack, sizeof ack, {}});
      for (uint64_t i = 0; i < iters; ++i) (void)l.post_send(++id, {src, size, {}});
      finish(l, Completion::kRecv, rid);
      double dt = now_s() - t0;
      std::vector<Completion> rest;
      while (l.pending() != 0) l.progress(&rest);
      double rate = double(size) * double(iters) / dt / 1e9;
      if (rate > best) {
        best = rate;
        best_ack = ack;
        tx_busy = g_times.progress_s / dt;
        tx_wait = g_times.wait_s / dt;
        tx_faults = minor_faults() - f0;
        tx_wakeups = l.stats().wakeups_sent - w0;
      }
    }
    double bytes = double(size) * double(iters), round_s = bytes / (best * 1e9);
    // *_busy: fraction of the round inside progress() (copying); *_copy_GBps: bytes / that time.
    fmt::print(
        "{{\"bench\":\"shm.host_to_host\",\"size\":{},\"iters\":{},\"rounds\":{},\"slot_size\":{},"
        "\"slots\":{},\"copy_threads\":{},\"shm_GBps\":{:.2f},\"memcpy_1thread_GBps\":{:.2f},\"ratio\":{:.3f},"
        "\"memcpy_cold_dst_GBps\":{:.2f},\"tx_busy\":{:.2f},\"tx_wait\":{:.2f},\"tx_copy_GBps\":{:.2f},"
        "\"tx_faults\":{},\"tx_wakeups\":{},\"rx_busy\":{:.2f},\"rx_wait\":{:.2f},\"rx_copy_GBps\":{:.2f},"
        "\"rx_faults\":{},\"rx_wakeups\":{}}}\n",
        size, iters, rounds, options.slot_size, options.slots, options.copy_threads, best, ref, best / ref, cold, tx_busy, tx_wait,
        tx_busy > 0 ? best / tx_busy : 0.0, tx_faults, tx_wakeups, best_ack.progress_s / round_s,
        best_ack.wait_s / round_s, best_ack.progress_s > 0 ? bytes / best_ack.progress_s / 1e9 : 0.0, best_ack.faults,
        best_ack.wakeups);
    std::fflush(stdout);
  }

  // 8-byte ping-pong.
  ctl = ~0ull;
  (void)l.post_send(++id, {&ctl, 8, {}});
  finish(l, Completion::kSend, id);
  const int kPings = 5000;
  uint64_t ping = 1, pong = 0;
  double t0 = now_s();
  for (int i = 0; i < kPings; ++i) {
    ping = (i + 1 == kPings) ? 0 : 1;
    (void)l.post_recv(++rid, {&pong, 8, {}});
    (void)l.post_send(++id, {&ping, 8, {}});
    finish(l, Completion::kSend, id);
    finish(l, Completion::kRecv, rid);
  }
  double half_rtt_us = (now_s() - t0) / kPings / 2 * 1e6;
  fmt::print("{{\"bench\":\"shm.latency\",\"size\":8,\"iters\":{},\"half_rtt_us\":{:.2f}}}\n", kPings, half_rtt_us);
  ctl = 0;
  (void)l.post_send(++id, {&ctl, 8, {}});
  finish(l, Completion::kSend, id);
  int st = 0;
  ::waitpid(child, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
