// shm_bench: host->host bandwidth between two processes over the shm link, next to single-thread
// memcpy bandwidth measured in the same run, and the 8-byte half round trip. One JSON line per
// measurement.
//
//   shm_bench [--min-size BYTES] [--max-size BYTES] [--slot-size BYTES] [--slots N] [--seconds S]
// Sizes: --min-size (4 KiB), then x16 up to --max-size.
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "transport/shm/shm.h"

using namespace dmx;
using shm::Completion;

namespace {

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

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
    if (link.progress(&out) == 0) {
      Status s = link.wait(Deadline::after(std::chrono::seconds(30)));
      if (!s.ok()) {
        fmt::print(stderr, "shm_bench: {}\n", s.to_string());
        ::_exit(1);
      }
    }
    for (auto& c : out) seen.emplace(std::make_pair(int(c.kind), c.id), std::move(c.status));
  }
}

double memcpy_gbps(size_t size, double seconds) {
  std::vector<char> a(size, 1), b(size, 2);
  std::memcpy(b.data(), a.data(), size);  // warm
  size_t iters = 0;
  double t0 = now_s(), t1 = t0;
  do {
    std::memcpy(b.data(), a.data(), size);
    asm volatile("" : : "r"(b.data()) : "memory");
    ++iters;
    t1 = now_s();
  } while (t1 - t0 < seconds);
  return double(size) * double(iters) / (t1 - t0) / 1e9;
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
  shm::LinkOptions options;
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
  auto pair = shm::UnixChannel::pair();
  if (!pair.ok()) return 1;
  // Iteration counts are decided by the parent per size and sent as the first 8-byte message.
  pid_t child = ::fork();
  if (child == 0) {
    { shm::UnixChannel drop = std::move(pair->first); }
    auto link = shm::ShmLink::accept(std::move(pair->second), Deadline::after(std::chrono::seconds(10)));
    if (!link.ok()) ::_exit(2);
    shm::ShmLink& l = **link;
    std::vector<char> buf(max_size, 3);
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
      for (uint64_t i = 0; i < iters; ++i) (void)l.post_recv(++id, {buf.data(), size, {}});
      for (uint64_t k = id - iters + 1; k <= id; ++k) finish(l, Completion::kRecv, k);
      (void)l.post_send(++sid, {&ctl, 8, {}});  // ack
      finish(l, Completion::kSend, sid);
    }
  }
  { shm::UnixChannel drop = std::move(pair->second); }
  auto link = shm::ShmLink::create(std::move(pair->first), options, Deadline::after(std::chrono::seconds(10)));
  if (!link.ok()) {
    fmt::print(stderr, "shm_bench: {}\n", link.status().to_string());
    return 1;
  }
  shm::ShmLink& l = **link;
  std::vector<char> src(max_size, 7);
  uint64_t ctl = 0, ack = 0, id = 0, rid = 0;

  for (size_t size : sizes) {
    double ref = memcpy_gbps(size, seconds / 2);
    uint64_t iters = std::max<uint64_t>(4, std::min<uint64_t>(100000, (4ull << 30) / size));
    double best = 0;
    for (int round = 0; round < 3; ++round) {
      ctl = (uint64_t(size) << 32) | iters;
      double t0 = now_s();
      (void)l.post_send(++id, {&ctl, 8, {}});
      (void)l.post_recv(++rid, {&ack, 8, {}});
      for (uint64_t i = 0; i < iters; ++i) (void)l.post_send(++id, {src.data(), size, {}});
      finish(l, Completion::kRecv, rid);
      double dt = now_s() - t0;
      std::vector<Completion> rest;
      while (l.pending() != 0) l.progress(&rest);
      best = std::max(best, double(size) * double(iters) / dt / 1e9);
    }
    fmt::print("{{\"bench\":\"shm.host_to_host\",\"size\":{},\"iters\":{},\"slot_size\":{},\"slots\":{},"
               "\"shm_GBps\":{:.2f},\"memcpy_1thread_GBps\":{:.2f},\"ratio\":{:.3f}}}\n",
               size, iters, options.slot_size, options.slots, best, ref, best / ref);
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
