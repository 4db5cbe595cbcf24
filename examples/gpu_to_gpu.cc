// GPU to GPU: sends from one cuda:0 buffer to another (between hosts, each side its own GPU). dmx
// picks the path (cuda_ipc on one host, staged TCP between hosts). Without a usable GPU it prints
// "skipped: <reason>" and exits 0.
#include <dmx/dmx.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

static int fail(const dmx::Status& status) {
  std::fprintf(stderr, "gpu_to_gpu failed: %s\n", status.to_string().c_str());
  return 1;
}

int main() {
  using std::chrono::seconds;
  const dmx::MemSpec gpu{dmx::MemKind::kCuda, 0}, host{dmx::MemKind::kHost, 0};
  if (dmx::Status s = dmx::mem_available(gpu); !s.ok()) {
    std::printf("gpu_to_gpu: skipped: %s\n", s.to_string().c_str());
    return 0;
  }
  std::vector<unsigned char> out(8 << 20), back(out.size());
  std::mt19937 rng(std::random_device{}());
  for (auto& b : out) b = static_cast<unsigned char>(rng());
  dmx::Result<dmx::Buffer> src = dmx::Buffer::allocate(gpu, out.size());
  if (!src.ok()) return fail(src.status());
  dmx::Result<dmx::Buffer> dst = dmx::Buffer::allocate(gpu, out.size());
  if (!dst.ok()) return fail(dst.status());
  if (dmx::Status s = dmx::copy_memory(src->region(), {out.data(), out.size(), host}); !s.ok()) return fail(s);

  dmx::Result<dmx::Context> server = dmx::Context::create();
  if (!server.ok()) return fail(server.status());
  dmx::Result<dmx::Listener> listener = server->listen("tcp://127.0.0.1:0");
  if (!listener.ok()) return fail(listener.status());
  dmx::Result<dmx::Context> client = dmx::Context::create();
  if (!client.ok()) return fail(client.status());
  dmx::Result<dmx::Endpoint> tx = client->connect(listener->address());
  if (!tx.ok()) return fail(tx.status());
  dmx::Result<dmx::Endpoint> rx = listener->accept(seconds(10));
  if (!rx.ok()) return fail(rx.status());

  dmx::Request recv = rx->recv(dst->region(), /*tag=*/3);
  dmx::Request send = tx->send(src->region(), /*tag=*/3);
  for (const dmx::Request& r : {send, recv}) {
    if (dmx::Status s = r.wait(seconds(30)); !s.ok()) return fail(s);
  }
  if (dmx::Status s = dmx::copy_memory({back.data(), back.size(), host}, dst->region()); !s.ok()) return fail(s);
  if (back != out) return fail(dmx::Status(dmx::Code::kInternal, "the GPU buffers differ after the transfer"));
  std::printf("gpu_to_gpu: %zu bytes cuda:0 -> cuda:0 over %s, verified\n", out.size(), tx->stats().transport.c_str());
  return 0;
}
