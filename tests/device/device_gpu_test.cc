// GPU tests of kernel-initiated operations (dmx/device.cuh) and of GPU push (docs/gpu-push.md),
// between two processes on real GPUs (cuda:0 -> cuda:1 when there are two). CUDA cannot be used
// in a child forked after the parent initialised it, so the probe and both peers run in forked
// children; skipped with the reason when there is no usable GPU. Fresh random data every run.
//
// DeviceApiGpu.KernelReadsWhatLanded is the memory-ordering contract's test; run it (and
// GpuPushGpu.SmallPushedAndLargeCopiedArriveInOrder) under compute-sanitizer racecheck and
// synccheck with --target-processes all (scripts/gpu-push-check.sh).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "device/device_kernels.h"
#include "engine/test_util.h"
#include "transport/gpu_children.h"
#include "transport/transport_test_util.h"

namespace dmx {
namespace {

using namespace std::chrono_literals;
using testing::probe_gpus;

#define REQUIRE_GPUS(n_var)     \
  std::string why;              \
  int n_var = probe_gpus(&why); \
  if (n_var < 1) DMX_SKIP(::dmx::test::kNoGpu) << why

constexpr int kChildSkip = 77;

uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd() ^ 0x9e3779b97f4a7c15ull;
}

// The server and the client in two forked children; options `o` on both sides.
void run_pair(const Options& o, const std::function<int(Context&, Endpoint&)>& server,
              const std::function<int(Context&, Endpoint&)>& client, bool server_may_die = false) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t s = testing::fork_child([&] {
    ::close(fds[0]);
    auto ctx = Context::create(o);
    CHILD_CHECK(ctx.ok(), 10);
    auto l = ctx->listen("tcp://127.0.0.1:0");
    CHILD_CHECK(l.ok(), 11);
    std::string addr = l->address();
    CHILD_CHECK(::write(fds[1], addr.data(), addr.size()) == static_cast<ssize_t>(addr.size()), 12);
    ::close(fds[1]);
    auto ep = l->accept(20s);
    CHILD_CHECK(ep.ok(), 13);
    int r = server(*ctx, *ep);
    (void)ep->close();
    return r;
  });
  ::close(fds[1]);
  char buf[256] = {};
  ssize_t got = ::read(fds[0], buf, sizeof buf - 1);
  ::close(fds[0]);
  pid_t c = testing::fork_child([&] {
    CHILD_CHECK(got > 0, 20);
    auto ctx = Context::create(o);
    CHILD_CHECK(ctx.ok(), 21);
    auto ep = ctx->connect(std::string(buf, static_cast<size_t>(got)));
    CHILD_CHECK(ep.ok(), 22);
    EndpointStats st = ep->stats();
    fprintf(stderr, "client: transport %s (%s)\n", st.transport.c_str(), st.reason.c_str());
    int r = client(*ctx, *ep);
    (void)ep->close();
    return r;
  });
  EXPECT_EQ(testing::wait_child(c, 180s), 0) << "client";
  int sc = testing::wait_child(s, 180s);
  if (server_may_die) return;
  if (sc == kChildSkip) DMX_SKIP(::dmx::test::kNotExercised) << "the server could not set the test up; its reason is above";
  EXPECT_EQ(sc, 0) << "server";
}

Options options_for(const std::string& transport, const std::string& push) {
  Options o = test::test_options(2);
  o.set("transport", transport).set("gpu_push", push);
  return o;
}

// Sends a RemoteRegion to the peer (host memory, tag 1) / receives it.
bool send_remote(Endpoint& ep, const RemoteRegion& r) {
  std::vector<unsigned char> bytes = r.serialize();
  return ep.send(MemRegion{bytes.data(), bytes.size()}, 1).wait(30s).ok();
}
Result<RemoteRegion> recv_remote(Endpoint& ep) {
  std::vector<unsigned char> bytes(64);
  Request r = ep.recv(MemRegion{bytes.data(), bytes.size()}, 1);
  DMX_RETURN_IF_ERROR(r.wait(30s));
  return RemoteRegion::parse(bytes.data(), r.bytes());
}
bool signal_peer(Endpoint& ep, uint64_t tag) {
  char b = 1;
  return ep.send(MemRegion{&b, 1}, tag).wait(60s).ok();
}
bool wait_peer(Endpoint& ep, uint64_t tag) {
  char b = 0;
  return ep.recv(MemRegion{&b, 1}, tag).wait(120s).ok();
}

struct Case {
  std::string transport;
  std::string push;
};
std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  return (i.param.transport == "tcp" ? std::string("Tcp") : std::string("CudaIpc")) +
         (i.param.push == "on" ? "PushOn" : "PushOff");
}
const std::vector<Case> kCases = {{"cuda_ipc", "on"}, {"cuda_ipc", "off"}, {"tcp", "on"}, {"tcp", "off"}};

class DeviceApiGpu : public ::testing::TestWithParam<Case> {};

// The memory-ordering contract: a kernel posts 64 writes of 4097 B with notifications, each of
// fresh bytes computed on the GPU, into a poisoned region of the peer's GPU; the peer's kernel
// waits for each notification and then reads that round's bytes. It must see exactly them, never
// the poison (stale) nor another round's.
TEST_P(DeviceApiGpu, KernelReadsWhatLanded) {
  REQUIRE_GPUS(gpus);
  const uint64_t seed = fresh_seed();
  constexpr int kRounds = 64;
  constexpr uint64_t kLen = 4097;
  const int server_gpu = gpus > 1 ? 1 : 0;
  run_pair(
      options_for(GetParam().transport, GetParam().push),
      [&](Context& ctx, Endpoint& ep) {
        CHILD_CHECK(test::set_device(server_gpu).empty(), 30);
        uint64_t bytes = kRounds * kLen + 4096;  // and room for the client's warm-up write
        auto region = Buffer::allocate(MemSpec{MemKind::kCuda, server_gpu}, bytes);
        CHILD_CHECK(region.ok(), 31);
        std::vector<unsigned char> poison(bytes, 0xA5);
        CHILD_CHECK(copy_memory(region->region(), MemRegion{poison.data(), poison.size()}).ok(), 32);
        auto reg = ctx.register_memory(region->region());
        CHILD_CHECK(reg.ok(), 33);
        DeviceHandleOptions ho;
        ho.device = server_gpu;
        ho.notifications = true;
        ho.timeout = 60s;
        auto h = ep.device_handle(ho);
        if (!h.ok()) {
          fprintf(stderr, "server: device_handle: %s\n", h.status().to_string().c_str());
          return kChildSkip;
        }
        CHILD_CHECK(send_remote(ep, reg->remote()), 34);
        int* result = static_cast<int*>(test::device_alloc(sizeof(int)));
        CHILD_CHECK(result != nullptr, 35);
        std::string err =
            test::run_check_rounds(*h, static_cast<const unsigned char*>(region->data()), kLen, kRounds, seed, result);
        CHILD_CHECK(err.empty(), 36);
        int r = -1;
        CHILD_CHECK(test::copy_to_host(&r, result, sizeof r).empty(), 37);
        fprintf(stderr, "server: check kernel result %d\n", r);
        CHILD_CHECK(r == 0, 38);
        CHILD_CHECK(signal_peer(ep, 2), 39);
        return 0;
      },
      [&](Context&, Endpoint& ep) {
        CHILD_CHECK(test::set_device(0).empty(), 40);
        auto remote = recv_remote(ep);
        CHILD_CHECK(remote.ok(), 41);
        auto src = Buffer::allocate(MemSpec{MemKind::kCuda, 0}, kLen);
        CHILD_CHECK(src.ok(), 42);
        // A host-driven write first: the path's first use sets things up (handles, engines) that
        // a device with a spinning kernel should not have to.
        CHILD_CHECK(ep.write(src->region().sub(0, 8), *remote, kRounds * kLen).wait(60s).ok(), 43);
        DeviceHandleOptions ho;
        ho.timeout = 60s;
        auto h = ep.device_handle(ho);
        CHILD_CHECK(h.ok(), 44);
        int* result = static_cast<int*>(test::device_alloc(sizeof(int)));
        CHILD_CHECK(result != nullptr, 45);
        DeviceRemote dst{remote->key, remote->size};
        std::string err =
            test::run_put_rounds(*h, static_cast<unsigned char*>(src->data()), kLen, dst, kRounds, seed, result);
        CHILD_CHECK(err.empty(), 46);
        int r = -1;
        CHILD_CHECK(test::copy_to_host(&r, result, sizeof r).empty(), 47);
        fprintf(stderr, "client: put kernel result %d; gpu push: %s (%llu pushed)\n", r, ep.stats().gpu_push.c_str(),
                static_cast<unsigned long long>(ep.stats().gpu_pushes));
        CHILD_CHECK(r == 0, 48);
        CHILD_CHECK(wait_peer(ep, 2), 49);
        return 0;
      });
}

// A kernel keeps writing to a peer that gets killed: its wait returns the endpoint's error
// (peer failed or closed) well within the handle's 60 s deadline; the kernel never hangs.
TEST_P(DeviceApiGpu, DeadPeerGivesTheErrorWordNotAHang) {
  REQUIRE_GPUS(gpus);
  const int server_gpu = gpus > 1 ? 1 : 0;
  run_pair(
      options_for(GetParam().transport, GetParam().push),
      [&](Context& ctx, Endpoint& ep) {
        auto region = Buffer::allocate(MemSpec{MemKind::kCuda, server_gpu}, 4096);
        CHILD_CHECK(region.ok(), 30);
        auto reg = ctx.register_memory(region->region());
        CHILD_CHECK(reg.ok(), 31);
        CHILD_CHECK(send_remote(ep, reg->remote()), 32);
        CHILD_CHECK(wait_peer(ep, 3), 33);  // the client's kernel is running
        std::this_thread::sleep_for(200ms);
        ::kill(::getpid(), SIGKILL);
        return 0;
      },
      [&](Context&, Endpoint& ep) {
        CHILD_CHECK(test::set_device(0).empty(), 40);
        auto remote = recv_remote(ep);
        CHILD_CHECK(remote.ok(), 41);
        auto src = Buffer::allocate(MemSpec{MemKind::kCuda, 0}, 64);
        CHILD_CHECK(src.ok(), 42);
        CHILD_CHECK(ep.write(src->region().sub(0, 8), *remote, 0).wait(60s).ok(), 43);
        DeviceHandleOptions ho;
        ho.timeout = 60s;
        auto h = ep.device_handle(ho);
        CHILD_CHECK(h.ok(), 44);
        auto* out = static_cast<uint64_t*>(test::device_alloc(3 * sizeof(uint64_t)));
        CHILD_CHECK(out != nullptr, 45);
        CHILD_CHECK(signal_peer(ep, 3), 46);
        auto start = std::chrono::steady_clock::now();
        std::string err = test::run_until_failure(*h, static_cast<unsigned char*>(src->data()),
                                                  DeviceRemote{remote->key, remote->size}, reinterpret_cast<int*>(out),
                                                  out + 1, out + 2);
        auto took = std::chrono::steady_clock::now() - start;
        CHILD_CHECK(err.empty(), 47);
        uint64_t host[3] = {};
        CHILD_CHECK(test::copy_to_host(host, out, sizeof host).empty(), 48);
        int rc = static_cast<int>(static_cast<int32_t>(host[0] & 0xffffffffu));
        fprintf(stderr, "client: kernel ended with %d after %llu writes, the failing call took %.3f ms (%.0f ms in all)\n",
                rc, static_cast<unsigned long long>(host[2]), host[1] / 1e6,
                std::chrono::duration<double, std::milli>(took).count());
        CHILD_CHECK(rc == -kDevicePeerFailed || rc == -kDeviceClosed, 49);
        CHILD_CHECK(host[1] < 30'000'000'000ull, 50);  // the error word, not the 60 s deadline
        CHILD_CHECK(ep.health().code() == Code::kPeerFailed || ep.health().code() == Code::kClosed, 51);
        return 0;
      },
      /*server_may_die=*/true);
}

INSTANTIATE_TEST_SUITE_P(Paths, DeviceApiGpu, ::testing::ValuesIn(kCases), case_name);

// Direct puts over cuda_ipc, the memory-ordering contract of block_put_signal / block_wait_signal:
// the client's kernel stores 64 rounds of 4097 fresh bytes straight into the server's poisoned
// region (mapped by import_device_window) and sets the server's signal word; the server's kernel
// waits for each signal and must see exactly that round's bytes. The host hears of every put
// afterwards (EndpointStats::device_direct_puts). Also: importing garbage is kProtocol, importing
// before the handle exists kInvalidArgument.
TEST(DeviceDirectGpu, KernelReadsWhatWasStored) {
  REQUIRE_GPUS(gpus);
  const uint64_t seed = fresh_seed();
  constexpr int kRounds = 64;
  constexpr uint64_t kLen = 4097;
  const int server_gpu = gpus > 1 ? 1 : 0;
  run_pair(
      options_for("cuda_ipc", "off"),
      [&](Context&, Endpoint& ep) {
        CHILD_CHECK(test::set_device(server_gpu).empty(), 30);
        auto region = Buffer::allocate(MemSpec{MemKind::kCuda, server_gpu}, kRounds * kLen);
        auto signal = Buffer::allocate(MemSpec{MemKind::kCuda, server_gpu}, 64);
        CHILD_CHECK(region.ok() && signal.ok(), 31);
        std::vector<unsigned char> poison(kRounds * kLen, 0xA5), zeros(64, 0);
        CHILD_CHECK(copy_memory(region->region(), MemRegion{poison.data(), poison.size()}).ok(), 32);
        CHILD_CHECK(copy_memory(signal->region(), MemRegion{zeros.data(), zeros.size()}).ok(), 33);
        DeviceHandleOptions ho;
        ho.device = server_gpu;
        ho.timeout = 60s;
        auto h = ep.device_handle(ho);
        if (!h.ok()) {
          fprintf(stderr, "server: device_handle: %s\n", h.status().to_string().c_str());
          return kChildSkip;
        }
        auto wr = ep.export_device_window(region->region());
        auto ws = ep.export_device_window(signal->region());
        if (!wr.ok() || !ws.ok()) {
          fprintf(stderr, "server: export_device_window: %s\n",
                  (wr.ok() ? ws.status() : wr.status()).to_string().c_str());
          return kChildSkip;
        }
        CHILD_CHECK(ep.send(MemRegion{wr->data(), wr->size()}, 4).wait(30s).ok(), 34);
        CHILD_CHECK(ep.send(MemRegion{ws->data(), ws->size()}, 5).wait(30s).ok(), 35);
        int* result = static_cast<int*>(test::device_alloc(sizeof(int)));
        CHILD_CHECK(result != nullptr, 36);
        std::string err = test::run_direct_check_rounds(*h, static_cast<const unsigned char*>(region->data()), kLen,
                                                        static_cast<const uint64_t*>(signal->data()), kRounds, seed,
                                                        result);
        CHILD_CHECK(err.empty(), 37);
        int r = -1;
        CHILD_CHECK(test::copy_to_host(&r, result, sizeof r).empty(), 38);
        fprintf(stderr, "server: check kernel result %d\n", r);
        CHILD_CHECK(r == 0, 39);
        CHILD_CHECK(wait_peer(ep, 2), 40);
        return 0;
      },
      [&](Context&, Endpoint& ep) {
        CHILD_CHECK(test::set_device(0).empty(), 50);
        std::vector<unsigned char> wr(256), ws(256);
        Request rr = ep.recv(MemRegion{wr.data(), wr.size()}, 4), rs = ep.recv(MemRegion{ws.data(), ws.size()}, 5);
        CHILD_CHECK(rr.wait(60s).ok() && rs.wait(60s).ok(), 51);
        wr.resize(rr.bytes());
        ws.resize(rs.bytes());
        CHILD_CHECK(ep.import_device_window(wr).status().code() == Code::kInvalidArgument, 52);  // no handle yet
        DeviceHandleOptions ho;
        ho.timeout = 60s;
        auto h = ep.device_handle(ho);
        CHILD_CHECK(h.ok(), 53);
        std::vector<unsigned char> junk = wr;
        junk[0] ^= 0x5a;  // the magic
        CHILD_CHECK(ep.import_device_window(junk).status().code() == Code::kProtocol, 54);
        auto data = ep.import_device_window(wr);
        auto sig = ep.import_device_window(ws);
        if (!data.ok() || !sig.ok())
          fprintf(stderr, "client: import_device_window: %s\n",
                  (data.ok() ? sig.status() : data.status()).to_string().c_str());
        CHILD_CHECK(data.ok() && sig.ok(), 55);
        CHILD_CHECK(data->size == kRounds * kLen && sig->size == 64, 56);
        auto src = Buffer::allocate(MemSpec{MemKind::kCuda, 0}, kLen);
        CHILD_CHECK(src.ok(), 57);
        int* result = static_cast<int*>(test::device_alloc(sizeof(int)));
        CHILD_CHECK(result != nullptr, 58);
        std::string err = test::run_direct_put_rounds(*h, static_cast<unsigned char*>(src->data()), kLen, *data, *sig,
                                                      kRounds, seed, result);
        CHILD_CHECK(err.empty(), 59);
        int r = -1;
        CHILD_CHECK(test::copy_to_host(&r, result, sizeof r).empty(), 60);
        fprintf(stderr, "client: put kernel result %d\n", r);
        CHILD_CHECK(r == 0, 61);
        EndpointStats st;
        for (int i = 0; i < 500 && (st = ep.stats()).device_direct_puts < kRounds; ++i) std::this_thread::sleep_for(10ms);
        fprintf(stderr, "client: the host heard of %llu direct puts, %llu B\n",
                static_cast<unsigned long long>(st.device_direct_puts),
                static_cast<unsigned long long>(st.device_direct_bytes));
        CHILD_CHECK(st.device_direct_puts == kRounds && st.device_direct_bytes == kRounds * kLen, 62);
        CHILD_CHECK(signal_peer(ep, 2), 63);
        return 0;
      });
}

class GpuPushGpu : public ::testing::TestWithParam<Case> {};

std::vector<unsigned char> message(uint64_t seed, uint64_t i, size_t n) {
  std::mt19937_64 rng(seed * 1000003 + i);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

// 40 sends of one tag, posted at once, alternating 8 B (pushed when push is on) and 1 MiB + 3
// (copy engine): the receives, matched in order, get them in order, byte for byte.
TEST_P(GpuPushGpu, SmallPushedAndLargeCopiedArriveInOrder) {
  REQUIRE_GPUS(gpus);
  const uint64_t seed = fresh_seed();
  constexpr int kMessages = 40;
  auto size_of = [](int i) -> size_t { return i % 2 == 0 ? 8 : (1 << 20) + 3; };
  const int server_gpu = gpus > 1 ? 1 : 0;
  const bool push = GetParam().push == "on";
  const bool tcp = GetParam().transport == "tcp";
  run_pair(
      options_for(GetParam().transport, GetParam().push),
      [&](Context&, Endpoint& ep) {
        std::vector<Buffer> dst;
        std::vector<Request> recvs;
        for (int i = 0; i < kMessages; ++i) {
          auto b = Buffer::allocate(MemSpec{MemKind::kCuda, server_gpu}, (1 << 20) + 3);
          CHILD_CHECK(b.ok(), 30);
          recvs.push_back(ep.recv(b->region(), 5));
          dst.push_back(std::move(*b));
        }
        CHILD_CHECK(signal_peer(ep, 2), 31);
        for (int i = 0; i < kMessages; ++i) {
          CHILD_CHECK(recvs[i].wait(120s).ok(), 32);
          CHILD_CHECK(recvs[i].bytes() == size_of(i), 33);
          std::vector<unsigned char> got(size_of(i));
          CHILD_CHECK(copy_memory(MemRegion{got.data(), got.size()}, dst[i].region().sub(0, got.size())).ok(), 34);
          if (got != message(seed, i, got.size())) {
            fprintf(stderr, "server: message %d (%zu B) is not the %d-th sent\n", i, got.size(), i);
            return 35;
          }
        }
        EndpointStats st = ep.stats();
        uint64_t pushed = st.gpu_pushes;
        for (const auto& p : st.paths) {
          std::smatch m;
          if (std::regex_search(p.detail, m, std::regex("\\((\\d+) copies pushed\\)"))) pushed += std::stoull(m[1]);
          fprintf(stderr, "server: path %s: %s\n", p.name.c_str(), p.detail.c_str());
        }
        fprintf(stderr, "server: %llu copies pushed; %s\n", static_cast<unsigned long long>(pushed), st.gpu_push.c_str());
        if (push) CHILD_CHECK(pushed > 0, 36);
        else CHILD_CHECK(pushed == 0, 37);
        CHILD_CHECK(signal_peer(ep, 3), 38);
        return 0;
      },
      [&](Context&, Endpoint& ep) {
        std::vector<Buffer> src;
        for (int i = 0; i < kMessages; ++i) {
          auto m = message(seed, i, size_of(i));
          auto b = Buffer::allocate(MemSpec{MemKind::kCuda, 0}, m.size());
          CHILD_CHECK(b.ok(), 40);
          CHILD_CHECK(copy_memory(b->region(), MemRegion{m.data(), m.size()}).ok(), 41);
          src.push_back(std::move(*b));
        }
        CHILD_CHECK(wait_peer(ep, 2), 42);
        std::vector<Request> sends;
        for (int i = 0; i < kMessages; ++i) sends.push_back(ep.send(src[i].region(), 5));
        for (auto& s : sends) CHILD_CHECK(s.wait(120s).ok(), 43);
        EndpointStats st = ep.stats();
        fprintf(stderr, "client: %llu staging copies pushed, %llu d2h; %s\n",
                static_cast<unsigned long long>(st.gpu_pushes), static_cast<unsigned long long>(st.d2h_copies),
                st.gpu_push.c_str());
        if (tcp && push) CHILD_CHECK(st.gpu_pushes > 0, 44);
        if (!push) CHILD_CHECK(st.gpu_pushes == 0, 45);
        CHILD_CHECK(wait_peer(ep, 3), 46);
        return 0;
      });
}

INSTANTIATE_TEST_SUITE_P(Paths, GpuPushGpu, ::testing::ValuesIn(kCases), case_name);

// A process's first push (an 8-byte staged receive: pinned slot -> device) while a kernel of the
// user spins on the same device until the data lands, as a kernel waiting for a notification
// does. Under lazy loading the push kernel's first launch would load it, and that may wait for the
// device to go idle: the push waited for the spinner and the spinner for the push (the spinner
// gives up after 30 s). dmx loads its kernels when it first uses the device; the push completes
// while the spinner still runs. (DeviceApiGpu.KernelReadsWhatLanded/TcpPushOn failed so.)
TEST(GpuPushSpinGpu, FirstPushWhileAKernelSpins) {
  REQUIRE_GPUS(gpus);
  (void)gpus;
  const uint64_t seed = fresh_seed();
  pid_t c = testing::fork_child([&] {
    CHILD_CHECK(test::set_device(0).empty(), 10);
    auto backend = cuda_backend(0);  // dmx's first use of the device
    CHILD_CHECK(backend.ok(), 11);
    auto queue = (*backend)->create_queue();
    CHILD_CHECK(queue.ok(), 12);
    auto staging = (*backend)->allocate_staging(64);
    CHILD_CHECK(staging.ok(), 13);
    auto dev = (*backend)->allocate(64);
    CHILD_CHECK(dev.ok(), 14);
    std::vector<unsigned char> want = message(seed, 0, 8);
    std::memcpy(*staging, want.data(), want.size());
    CHILD_CHECK(test::start_spinner(30'000'000'000ull).empty(), 15);
    auto t0 = std::chrono::steady_clock::now();
    Status pushed = (*queue)->push(*dev, *staging, want.size());
    CHILD_CHECK(pushed.ok(), 16);
    auto fence = (*queue)->record();
    CHILD_CHECK(fence.ok(), 17);
    Status waited = (*queue)->wait(*fence, Deadline::after(20s));
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    bool stopped = false;
    CHILD_CHECK(test::stop_spinner(&stopped).empty(), 18);
    fprintf(stderr, "child: push %s after %.3f ms; the spinner %s\n", waited.to_string().c_str(), ms,
            stopped ? "was still running" : "had given up (the push waited for it)");
    CHILD_CHECK(waited.ok(), 19);
    CHILD_CHECK(stopped, 20);
    std::vector<unsigned char> got(want.size());
    CHILD_CHECK(test::copy_to_host(got.data(), *dev, got.size()).empty(), 21);
    CHILD_CHECK(got == want, 22);
    return 0;
  });
  EXPECT_EQ(testing::wait_child(c, 120s), 0);
}

}  // namespace
}  // namespace dmx
