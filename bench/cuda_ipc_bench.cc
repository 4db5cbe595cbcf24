// cuda_ipc_bench: GPU0 -> GPU1 between two processes with cuda_ipc writes, next to
// cudaMemcpyPeer in one process measured in the same run, plus the 8-byte half round trip
// (IPC write + completion + notification over the shm link). One JSON line per measurement.
// Needs two GPUs; prints a "skipped" line with the reason otherwise.
//
//   cuda_ipc_bench [--max-size BYTES] [--iters-large N]
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "memory/backend.h"
#include "transport/cuda_ipc/cuda_ipc.h"
#include "transport/shm/shm.h"

using namespace dmx;

namespace {

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }
Deadline soon() { return Deadline::after(std::chrono::seconds(60)); }

[[noreturn]] void die(const std::string& what, const Status& s) {
  fmt::print(stderr, "cuda_ipc_bench ({}): {}: {}\n", ::getpid(), what, s.to_string());
  ::_exit(1);
}
#define CHECK_OK(what, expr)      \
  do {                            \
    Status s_ = (expr);           \
    if (!s_.ok()) die(what, s_);  \
  } while (0)

void finish(cuda_ipc::CopyEngine& e, size_t n) {
  std::vector<cuda_ipc::CopyCompletion> out;
  size_t got = 0;
  while (got < n) {
    out.clear();
    got += e.progress(&out);
    for (auto& c : out)
      if (!c.status.ok()) die("copy", c.status);
    if (got < n) CHECK_OK("wait", e.wait(soon()));
  }
}

void shm_finish(shm::ShmLink& l, shm::Completion::Kind kind, shm::MsgId id) {
  static std::vector<shm::Completion> seen;
  for (;;) {
    for (size_t i = 0; i < seen.size(); ++i)
      if (seen[i].kind == kind && seen[i].id == id) {
        if (!seen[i].status.ok()) die("shm", seen[i].status);
        seen.erase(seen.begin() + long(i));
        return;
      }
    if (l.progress(&seen) == 0) CHECK_OK("shm wait", l.wait(soon()));
  }
}

size_t arg_size(int argc, char** argv, const char* name, size_t def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == name) return std::stoull(argv[i + 1]);
  return def;
}

int gpus() {
  if (!cuda_ipc::available().ok()) return 0;
  auto n = cuda_device_count();
  return n.ok() ? *n : 0;
}

constexpr int kPings = 2000;

// GPU1 side: owns the destination, exports it, echoes pings.
int receiver(UnixChannel ch, size_t max_size) {
  if (gpus() < 2) return 0;
  auto dst = Buffer::allocate({MemKind::kCuda, 1}, max_size);
  if (!dst.ok()) die("allocate cuda:1", dst.status());
  cuda_ipc::Exporter ex;
  auto d = ex.export_region(dst->region());
  if (!d.ok()) die("export", d.status());
  CHECK_OK("send descriptor", ch.send(d->encode(), {}, soon()));
  std::vector<std::byte> msg;
  CHECK_OK("recv descriptor", ch.recv(&msg, 0, nullptr, soon()));
  auto peer_buf = cuda_ipc::IpcDescriptor::decode(msg);
  if (!peer_buf.ok()) die("decode", peer_buf.status());
  // The parent measures bandwidth before it sets up the link: allow it time.
  auto link = shm::ShmLink::accept(std::move(ch), Deadline::after(std::chrono::minutes(10)));
  if (!link.ok()) die("shm accept", link.status());
  auto engine = cuda_ipc::CopyEngine::create({.device = 1, .streams = 1});
  if (!engine.ok()) die("engine", engine.status());
  std::string peer = (*link)->peer_name();
  uint64_t note = 0;
  for (uint64_t i = 1; i <= kPings; ++i) {
    CHECK_OK("post", (*link)->post_recv(i, {&note, 8, {}}));
    shm_finish(**link, shm::Completion::kRecv, i);
    CHECK_OK("write", (*engine)->write(i, dst->region().sub(0, 8), peer, *peer_buf, 0));
    finish(**engine, 1);
    CHECK_OK("post", (*link)->post_send(i, {&note, 8, {}}));
    shm_finish(**link, shm::Completion::kSend, i);
  }
  CHECK_OK("post", (*link)->post_recv(kPings + 1, {&note, 8, {}}));  // "bye"
  shm_finish(**link, shm::Completion::kRecv, kPings + 1);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  size_t max_size = arg_size(argc, argv, "--max-size", 256u << 20);
  size_t iters_large = arg_size(argc, argv, "--iters-large", 20);
  auto pair = UnixChannel::pair();
  if (!pair.ok()) return 1;
  // CUDA must not be initialised before fork(): the child would inherit an unusable state.
  pid_t child = ::fork();
  if (child == 0) {
    { UnixChannel drop = std::move(pair->first); }
    ::_exit(receiver(std::move(pair->second), max_size));
  }
  { UnixChannel drop = std::move(pair->second); }
  UnixChannel ch = std::move(pair->first);
  int n = gpus();
  if (n < 2) {
    Status why = cuda_ipc::available();
    fmt::print("{{\"bench\":\"cuda_ipc\",\"skipped\":\"needs 2 GPUs: {}\"}}\n",
               why.ok() ? fmt::format("{} found", n) : why.message());
    ::waitpid(child, nullptr, 0);
    return 0;
  }
  // Reference: cudaMemcpyPeer GPU0 -> GPU1 inside this process.
  auto src = Buffer::allocate({MemKind::kCuda, 0}, max_size);
  auto ref_dst = Buffer::allocate({MemKind::kCuda, 1}, max_size);
  auto pong = Buffer::allocate({MemKind::kCuda, 0}, 64);
  if (!src.ok() || !ref_dst.ok() || !pong.ok()) die("allocate", Status(Code::kResourceExhausted, "cuda buffers"));
  cudaSetDevice(0);
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  std::vector<std::byte> msg;
  CHECK_OK("recv descriptor", ch.recv(&msg, 0, nullptr, soon()));
  auto remote = cuda_ipc::IpcDescriptor::decode(msg);
  if (!remote.ok()) die("decode", remote.status());
  cuda_ipc::Exporter ex;
  auto mine = ex.export_region(pong->region().sub(0, 8));
  if (!mine.ok()) die("export", mine.status());
  CHECK_OK("send descriptor", ch.send(mine->encode(), {}, soon()));
  auto engine = cuda_ipc::CopyEngine::create({.device = 0});
  if (!engine.ok()) die("engine", engine.status());
  fmt::print(stderr, "cuda_ipc: {}\n", (*engine)->peer_access_report());
  std::string peer = ch.peer_name();

  for (size_t size = 64 << 10; size <= max_size; size *= 4) {
    size_t iters = size >= (64u << 20) ? iters_large : std::max<size_t>(20, (2ull << 30) / size);
    double best_ref = 0, best_ipc = 0;
    for (int round = 0; round < 3; ++round) {
      double t0 = now_s();
      for (size_t i = 0; i < iters; ++i) cudaMemcpyPeerAsync(ref_dst->data(), 1, src->data(), 0, size, stream);
      cudaStreamSynchronize(stream);
      best_ref = std::max(best_ref, double(size) * double(iters) / (now_s() - t0) / 1e9);
      t0 = now_s();
      for (size_t i = 0; i < iters; ++i)
        CHECK_OK("write", (*engine)->write(i, src->region().sub(0, size), peer, *remote, 0));
      finish(**engine, iters);
      best_ipc = std::max(best_ipc, double(size) * double(iters) / (now_s() - t0) / 1e9);
    }
    fmt::print("{{\"bench\":\"cuda_ipc.gpu0_to_gpu1\",\"size\":{},\"iters\":{},\"ipc_GBps\":{:.2f},"
               "\"memcpy_peer_GBps\":{:.2f},\"ratio\":{:.3f},\"peer_access\":{}}}\n",
               size, iters, best_ipc, best_ref, best_ipc / best_ref, (*engine)->can_access_peer(1));
    std::fflush(stdout);
  }

  // 8-byte half round trip: IPC write, its completion, a notification through the shm link.
  auto link = shm::ShmLink::create(std::move(ch), {}, soon());
  if (!link.ok()) die("shm create", link.status());
  uint64_t note = 1;
  double t0 = now_s();
  for (uint64_t i = 1; i <= kPings; ++i) {
    CHECK_OK("write", (*engine)->write(i, src->region().sub(0, 8), peer, *remote, 0));
    finish(**engine, 1);
    CHECK_OK("post", (*link)->post_recv(i, {&note, 8, {}}));
    CHECK_OK("post", (*link)->post_send(i, {&note, 8, {}}));
    shm_finish(**link, shm::Completion::kSend, i);
    shm_finish(**link, shm::Completion::kRecv, i);
  }
  double half = (now_s() - t0) / kPings / 2 * 1e6;
  fmt::print("{{\"bench\":\"cuda_ipc.latency\",\"size\":8,\"iters\":{},\"half_rtt_us\":{:.2f},"
             "\"note\":\"IPC write + event completion + shm notification, each direction\"}}\n",
             kPings, half);
  CHECK_OK("post", (*link)->post_send(kPings + 1, {&note, 8, {}}));
  shm_finish(**link, shm::Completion::kSend, kPings + 1);
  int st = 0;
  ::waitpid(child, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
