// all_pairs_bench: every GPU sends to every other GPU at once, through dmx over cuda_ipc (one
// process per GPU, as NCCL's ranks are), and the same pattern with cudaMemcpyPeerAsync in one
// process, in the same run. One JSON line per pair and method, then one aggregate per method.
//
//   all_pairs_bench [--gpus N] [--size 256M] [--iters 8] [--window 2] [--host]
//
// dmx: process i owns cuda:i, connects one endpoint to every other process and accepts one from
// each; on "go" it sends `iters` messages of `size` bytes to each peer (at most `window` in flight
// per peer) while receiving as many from each. A pair's GB/s is its receiver's bytes over the time
// from "go" to its last receive; the aggregate is all bytes over the slowest process's time. Every
// received buffer is checked byte-exact against the sender's fresh random bytes.
// cudaMemcpyPeer: one stream per pair on the source GPU, peer access on; the same bytes, timed by
// each pair's events and, for the aggregate, by the host clock around the whole set.
// CUDA must not be initialised before fork(): this process touches CUDA only after its children
// are gone. Fewer than two GPUs: one {"skipped": ...} line, exit 0. --host: the same exchange
// of host memory over shm between --gpus processes, no CUDA at all (to try the bench itself on a
// machine without GPUs).
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/units.h"
#include "dmx/dmx.h"
#include "memory/backend.h"

using namespace dmx;

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kHelloTag = 1ull << 62;
constexpr auto kDeadline = std::chrono::seconds(120);

struct Args {
  int gpus = 0;  // 0: all
  uint64_t size = 256ull << 20;
  int iters = 8;
  int window = 2;
  bool host = false;  // host memory over shm, no GPU
};

// A line-based pipe pair between the parent and one child.
struct Link {
  FILE* in = nullptr;   // read side
  FILE* out = nullptr;  // write side
  std::string line() {
    char buf[4096];
    if (in == nullptr || std::fgets(buf, sizeof buf, in) == nullptr) return {};
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  void say(const std::string& s) {
    std::fprintf(out, "%s\n", s.c_str());
    std::fflush(out);
  }
};

[[noreturn]] void child_fail(Link& parent, const std::string& why) {
  parent.say("FAIL " + why);
  ::_exit(1);
}

// The bytes process `gpu` sends in this run: fresh per run (`seed`), different per GPU.
void fill(uint64_t seed, int gpu, std::vector<unsigned char>& out) {
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(gpu));
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  for (; i < out.size(); ++i) out[i] = static_cast<unsigned char>(rng());
}

// One process per GPU: the dmx side.
int child(int me, int n, const Args& a, uint64_t seed, Link parent) {
  Options o;
  o.set("transport", a.host ? "shm" : "cuda_ipc", "all_pairs_bench");
  o.set_default("insecure", "true", "all_pairs_bench (loopback only)");
  auto ctx = Context::create(o);
  if (!ctx.ok()) child_fail(parent, "Context::create: " + ctx.status().to_string());
  auto l = ctx->listen("tcp://127.0.0.1:0");
  if (!l.ok()) child_fail(parent, "listen: " + l.status().to_string());
  parent.say("ADDR " + l->address());
  std::string peers = parent.line();  // "PEERS a0 a1 ..."
  std::vector<std::string> addr;
  for (size_t p = peers.find(' '); p != std::string::npos;) {
    size_t q = peers.find(' ', p + 1);
    addr.push_back(peers.substr(p + 1, q == std::string::npos ? std::string::npos : q - p - 1));
    p = q;
  }
  if (static_cast<int>(addr.size()) != n) child_fail(parent, "bad peer list: " + peers);

  // Outgoing endpoints: connect to every other; the first message names the sender.
  std::vector<Endpoint> out(n), in(n);
  std::thread acceptor([&] {
    for (int k = 0; k < n - 1; ++k) {
      auto ep = l->accept(kDeadline);
      if (!ep.ok()) child_fail(parent, "accept: " + ep.status().to_string());
      uint64_t who = 0;
      Status s = ep->recv(MemRegion{&who, sizeof who, {}}, kHelloTag).wait(kDeadline);
      if (!s.ok() || who >= static_cast<uint64_t>(n) || in[who].valid())
        child_fail(parent, "hello: " + s.to_string());
      in[who] = *std::move(ep);
    }
  });
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    auto ep = ctx->connect(addr[j]);
    if (!ep.ok()) child_fail(parent, fmt::format("connect to cuda:{}: {}", j, ep.status().to_string()));
    uint64_t who = static_cast<uint64_t>(me);
    if (Status s = ep->send(MemRegion{&who, sizeof who, {}}, kHelloTag).wait(kDeadline); !s.ok())
      child_fail(parent, "hello: " + s.to_string());
    out[j] = *std::move(ep);
  }
  acceptor.join();

  const MemSpec gpu = a.host ? MemSpec{MemKind::kHost, 0} : MemSpec{MemKind::kCuda, me};
  auto src = Buffer::allocate(gpu, a.size);
  if (!src.ok()) child_fail(parent, "allocate: " + src.status().to_string());
  std::vector<unsigned char> host(a.size);
  fill(seed, me, host);
  if (Status s = copy_memory(src->region(), MemRegion{host.data(), a.size, {}}); !s.ok())
    child_fail(parent, "fill: " + s.to_string());
  std::vector<Buffer> dst(n);
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    auto b = Buffer::allocate(gpu, a.size);
    if (!b.ok()) child_fail(parent, "allocate: " + b.status().to_string());
    dst[j] = *std::move(b);
  }
  // One round first (not timed): the paths set up their mappings and copy streams.
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    Request r = in[j].recv(dst[j].region(), 0);
    Request s = out[j].send(src->region(), 0);
    if (Status st = s.wait(kDeadline); !st.ok()) child_fail(parent, "warm-up send: " + st.to_string());
    if (Status st = r.wait(kDeadline); !st.ok()) child_fail(parent, "warm-up recv: " + st.to_string());
  }
  parent.say("READY");
  if (parent.line() != "GO") child_fail(parent, "no go");

  const auto t0 = Clock::now();
  std::vector<double> recv_s(n, 0);
  std::atomic<bool> bad{false};
  std::string why;
  std::mutex why_mu;
  auto note = [&](const std::string& w) {
    std::lock_guard lock(why_mu);
    if (!bad.exchange(true)) why = w;
  };
  // Each peer: one thread posts its sends and receives (window each way) and waits in order.
  std::vector<std::thread> threads;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    threads.emplace_back([&, j] {
      std::deque<Request> sends, recvs;
      int posted = 0, received = 0;
      while (received < a.iters && !bad) {
        while (posted < a.iters && static_cast<int>(recvs.size()) < a.window) {
          uint64_t tag = 1 + static_cast<uint64_t>(posted++);
          recvs.push_back(in[j].recv(dst[j].region(), tag));
          sends.push_back(out[j].send(src->region(), tag));
        }
        if (Status s = recvs.front().wait(kDeadline); !s.ok()) return note(fmt::format("recv from cuda:{}: {}", j, s.to_string()));
        recvs.pop_front();
        ++received;
        if (Status s = sends.front().wait(kDeadline); !s.ok()) return note(fmt::format("send to cuda:{}: {}", j, s.to_string()));
        sends.pop_front();
      }
      recv_s[j] = std::chrono::duration<double>(Clock::now() - t0).count();
      for (auto& s : sends)
        if (Status st = s.wait(kDeadline); !st.ok()) note(fmt::format("send to cuda:{}: {}", j, st.to_string()));
    });
  }
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  if (bad) child_fail(parent, why);

  std::vector<unsigned char> got(a.size);
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    fill(seed, j, host);
    if (Status s = copy_memory(MemRegion{got.data(), a.size, {}}, dst[j].region()); !s.ok())
      child_fail(parent, "read back: " + s.to_string());
    if (std::memcmp(got.data(), host.data(), a.size) != 0)
      child_fail(parent, fmt::format("the bytes from cuda:{} differ", j));
    EndpointStats st = in[j].stats();
    parent.say(fmt::format("PAIR {} {} {:.6f} {}", j, me, recv_s[j], st.transport));
  }
  parent.say(fmt::format("DONE {:.6f}", wall));
  if (parent.line() != "BYE") child_fail(parent, "no bye");
  for (auto& e : out)
    if (e.valid()) (void)e.close();
  for (auto& e : in)
    if (e.valid()) (void)e.close();
  ::_exit(0);
}

// How many GPUs, asked in a child so that this process stays without CUDA until its children end.
int count_gpus(std::string* why) {
  int p[2];
  if (::pipe(p) != 0) return 0;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    auto n = cuda_device_count();
    std::string s = n.ok() ? fmt::format("{}", *n) : "0 " + n.status().message();
    (void)!::write(p[1], s.data(), s.size());
    ::_exit(0);
  }
  ::close(p[1]);
  std::string s;
  char buf[512];
  for (ssize_t r; (r = ::read(p[0], buf, sizeof buf)) > 0;) s.append(buf, static_cast<size_t>(r));
  ::close(p[0]);
  ::waitpid(pid, nullptr, 0);
  int n = std::atoi(s.c_str());
  if (n == 0 && why != nullptr) *why = s.size() > 2 ? s.substr(2) : "no CUDA device";
  return n;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) o += c;
  }
  return o;
}

// Runs the dmx side: one child per GPU. Returns false (after printing the error) on a failure.
bool run_dmx(int n, const Args& a, double* aggregate) {
  const uint64_t seed = std::random_device{}() * 0x100000001ull + std::random_device{}();
  const char* path = a.host ? "shm" : "cuda_ipc";
  std::vector<Link> links(n);
  std::vector<pid_t> pids(n);
  for (int i = 0; i < n; ++i) {
    int down[2], up[2];
    if (::pipe(down) != 0 || ::pipe(up) != 0) return false;
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(down[1]);
      ::close(up[0]);
      for (int k = 0; k < i; ++k) std::fclose(links[k].in), std::fclose(links[k].out);
      child(i, n, a, seed, Link{::fdopen(down[0], "r"), ::fdopen(up[1], "w")});
    }
    ::close(down[0]);
    ::close(up[1]);
    links[i] = Link{::fdopen(up[0], "r"), ::fdopen(down[1], "w")};
    pids[i] = pid;
  }
  bool ok = true;
  auto expect = [&](int i, const char* word) {
    std::string l = links[i].line();
    if (l.rfind(word, 0) != 0) {
      fmt::print("{{\"bench\": \"all_pairs\", \"method\": \"dmx_{}\", \"error\": \"process {}: {}\"}}\n", path, i,
                 json_escape(l.empty() ? "exited" : l));
      ok = false;
    }
    return l;
  };
  std::string peers = "PEERS";
  for (int i = 0; i < n && ok; ++i) peers += " " + expect(i, "ADDR ").substr(5);
  for (int i = 0; i < n && ok; ++i) links[i].say(peers);
  for (int i = 0; i < n && ok; ++i) expect(i, "READY");
  for (int i = 0; i < n && ok; ++i) links[i].say("GO");
  double slowest = 0;
  for (int i = 0; i < n && ok; ++i) {
    for (int k = 0; k < n - 1 && ok; ++k) {
      std::string l = expect(i, "PAIR ");
      if (!ok) break;
      int from = 0, to = 0;
      double s = 0;
      char transport[64] = {};
      std::sscanf(l.c_str(), "PAIR %d %d %lf %63s", &from, &to, &s, transport);
      fmt::print("{{\"bench\": \"all_pairs\", \"method\": \"dmx_{}\", \"src\": {}, \"dst\": {}, \"size_bytes\": {}, "
                 "\"iters\": {}, \"seconds\": {:.6f}, \"gb_per_s\": {:.2f}, \"transport\": \"{}\", \"verified\": true}}\n",
                 path, from, to, a.size, a.iters, s, static_cast<double>(a.size) * a.iters / s / 1e9, transport);
    }
    if (!ok) break;
    std::string d = expect(i, "DONE ");
    if (ok) slowest = std::max(slowest, std::atof(d.c_str() + 5));
  }
  for (int i = 0; i < n; ++i) {
    if (ok) links[i].say("BYE");
    std::fclose(links[i].out);
  }
  for (int i = 0; i < n; ++i) {
    int st = 0;
    ::waitpid(pids[i], &st, 0);
    std::fclose(links[i].in);
  }
  if (!ok) return false;
  *aggregate = static_cast<double>(a.size) * a.iters * n * (n - 1) / slowest / 1e9;
  fmt::print("{{\"bench\": \"all_pairs\", \"method\": \"dmx_{}\", \"gpus\": {}, \"pairs\": {}, \"size_bytes\": {}, "
             "\"iters\": {}, \"seconds\": {:.6f}, \"aggregate_gb_per_s\": {:.2f}}}\n",
             path, n, n * (n - 1), a.size, a.iters, slowest, *aggregate);
  return true;
}

#define CUDA_OK(expr)                                                                                \
  do {                                                                                               \
    cudaError_t e_ = (expr);                                                                         \
    if (e_ != cudaSuccess) {                                                                         \
      fmt::print("{{\"bench\": \"all_pairs\", \"method\": \"cudaMemcpyPeer\", \"error\": \"{}: {}\"}}\n", #expr, \
                 cudaGetErrorName(e_));                                                              \
      return false;                                                                                  \
    }                                                                                                \
  } while (0)

// The same pattern with cudaMemcpyPeerAsync, in this process (after the children are gone).
bool run_peer(int n, const Args& a, double* aggregate) {
  struct Pair {
    int src, dst;
    void* to = nullptr;
    cudaStream_t stream = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
  };
  std::vector<void*> src(n);
  std::vector<Pair> pairs;
  for (int i = 0; i < n; ++i) {
    CUDA_OK(cudaSetDevice(i));
    for (int j = 0; j < n; ++j) {
      if (j == i) continue;
      int can = 0;
      CUDA_OK(cudaDeviceCanAccessPeer(&can, i, j));
      if (can) {
        cudaError_t e = cudaDeviceEnablePeerAccess(j, 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) CUDA_OK(e);
        (void)cudaGetLastError();
      }
    }
    CUDA_OK(cudaMalloc(&src[i], a.size));
    CUDA_OK(cudaMemset(src[i], 0x5a ^ i, a.size));
  }
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      if (j == i) continue;
      Pair p{i, j};
      CUDA_OK(cudaSetDevice(j));
      CUDA_OK(cudaMalloc(&p.to, a.size));
      CUDA_OK(cudaSetDevice(i));
      CUDA_OK(cudaStreamCreateWithFlags(&p.stream, cudaStreamNonBlocking));
      CUDA_OK(cudaEventCreate(&p.start));
      CUDA_OK(cudaEventCreate(&p.stop));
      pairs.push_back(p);
    }
  for (auto& p : pairs) CUDA_OK(cudaMemcpyPeerAsync(p.to, p.dst, src[p.src], p.src, a.size, p.stream));  // warm-up
  for (int i = 0; i < n; ++i) {
    CUDA_OK(cudaSetDevice(i));
    CUDA_OK(cudaDeviceSynchronize());
  }
  const auto t0 = Clock::now();
  for (auto& p : pairs) CUDA_OK(cudaEventRecord(p.start, p.stream));
  for (int k = 0; k < a.iters; ++k)
    for (auto& p : pairs) CUDA_OK(cudaMemcpyPeerAsync(p.to, p.dst, src[p.src], p.src, a.size, p.stream));
  for (auto& p : pairs) CUDA_OK(cudaEventRecord(p.stop, p.stream));
  for (auto& p : pairs) CUDA_OK(cudaEventSynchronize(p.stop));
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  for (auto& p : pairs) {
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, p.start, p.stop));
    double s = ms / 1e3;
    fmt::print("{{\"bench\": \"all_pairs\", \"method\": \"cudaMemcpyPeer\", \"src\": {}, \"dst\": {}, \"size_bytes\": {}, "
               "\"iters\": {}, \"seconds\": {:.6f}, \"gb_per_s\": {:.2f}}}\n",
               p.src, p.dst, a.size, a.iters, s, static_cast<double>(a.size) * a.iters / s / 1e9);
  }
  *aggregate = static_cast<double>(a.size) * a.iters * n * (n - 1) / wall / 1e9;
  fmt::print("{{\"bench\": \"all_pairs\", \"method\": \"cudaMemcpyPeer\", \"gpus\": {}, \"pairs\": {}, \"size_bytes\": {}, "
             "\"iters\": {}, \"seconds\": {:.6f}, \"aggregate_gb_per_s\": {:.2f}}}\n",
             n, n * (n - 1), a.size, a.iters, wall, *aggregate);
  for (auto& p : pairs) {
    (void)cudaSetDevice(p.src);
    (void)cudaStreamDestroy(p.stream);
    (void)cudaEventDestroy(p.start);
    (void)cudaEventDestroy(p.stop);
    (void)cudaFree(p.to);
  }
  for (void* s : src) (void)cudaFree(s);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--gpus") a.gpus = std::atoi(v.c_str());
    else if (k == "--iters") a.iters = std::max(1, std::atoi(v.c_str()));
    else if (k == "--window") a.window = std::max(1, std::atoi(v.c_str()));
    else if (k == "--host") a.host = v != "0";
    else if (k == "--size") {
      auto s = parse_size(v);
      if (!s.ok() || *s == 0) return fmt::print(stderr, "all_pairs_bench: --size {}: not a size\n", v), 2;
      a.size = *s;
    } else {
      return fmt::print(stderr, "usage: all_pairs_bench [--gpus N] [--size 256M] [--iters 8] [--window 2] [--host 1]\n"), 2;
    }
  }
  std::fflush(stdout);  // nothing buffered may be duplicated into the children
  std::string why;
  if (a.host) {
    double gbs = 0;
    return run_dmx(std::max(2, a.gpus), a, &gbs) ? 0 : 1;
  }
  int have = count_gpus(&why);
  int n = a.gpus > 0 ? std::min(a.gpus, have) : have;
  if (n < 2 || (a.gpus > 0 && have < a.gpus)) {
    fmt::print("{{\"bench\": \"all_pairs\", \"skipped\": \"needs {} GPUs, {} visible{}\"}}\n", std::max(2, a.gpus), have,
               why.empty() ? "" : ": " + json_escape(why));
    return 0;
  }
  std::fflush(stdout);
  double dmx_gbs = 0, peer_gbs = 0;
  bool ok = run_dmx(n, a, &dmx_gbs);
  std::fflush(stdout);
  ok = run_peer(n, a, &peer_gbs) && ok;
  if (ok)
    fmt::print("{{\"bench\": \"all_pairs\", \"gpus\": {}, \"dmx_over_cudaMemcpyPeer\": {:.3f}}}\n", n, dmx_gbs / peer_gbs);
  return ok ? 0 : 1;
}
